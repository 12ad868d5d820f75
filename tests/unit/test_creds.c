/*
 * tests/unit/test_creds.c - the credentials provider (creds.c): the parsers of
 * credential_process / IMDS / container JSON and STS XML, ISO 8601 expiry
 * times, the refresh schedule and retry backoff, and a provider whose
 * credential_process hands out credentials that expire in seconds (refreshes
 * happen, old references stay valid, failures keep the old credentials).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "creds.h"
#include "test_util.h"

static struct creds *parse(const char *json, enum creds_json_kind k, int want_rc, char *err)
{
    struct creds *c = NULL;
    int rc = creds_parse_json(json, strlen(json), k, &c, err, 256);
    cr_expect_eq(rc, want_rc, "rc %d, err %s", rc, err);
    return c;
}

Test(creds, process_json_version_1)
{
    char err[256] = "";
    struct creds *c = parse("{\"Version\": 1, \"AccessKeyId\": \"ASIAPROC\", \"SecretAccessKey\": "
                            "\"s\", \"SessionToken\": \"t\", \"Expiration\": "
                            "\"2026-12-01T06:00:00Z\"}",
                            CREDS_JSON_PROCESS, 0, err);
    cr_assert_not_null(c);
    cr_expect_str_eq(c->access_key_id, "ASIAPROC");
    cr_expect_str_eq(c->session_token, "t");
    cr_expect_eq(c->expiration, (time_t)1796104800);
    creds_unref(c);
    /* no Expiration and no token: long-term keys */
    c = parse("{\"Version\":1,\"AccessKeyId\":\"A\",\"SecretAccessKey\":\"s\"}", CREDS_JSON_PROCESS,
              0, err);
    cr_assert_not_null(c);
    cr_expect_eq(c->expiration, 0);
    cr_expect_null(c->session_token);
    creds_unref(c);
}

Test(creds, process_json_errors_are_clear_and_secret_free)
{
    char err[256];
    parse("{\"Version\":2,\"AccessKeyId\":\"A\",\"SecretAccessKey\":\"TOPSECRET\"}",
          CREDS_JSON_PROCESS, -EINVAL, err);
    cr_expect(strstr(err, "Version must be 1"), "%s", err);
    parse("{\"Version\":1,\"SecretAccessKey\":\"TOPSECRET\"}", CREDS_JSON_PROCESS, -EINVAL, err);
    cr_expect(strstr(err, "AccessKeyId is missing"), "%s", err);
    parse("{\"Version\":1,\"AccessKeyId\":\"A\",\"SecretAccessKey\":7}", CREDS_JSON_PROCESS,
          -EINVAL, err);
    cr_expect(strstr(err, "SecretAccessKey is not"), "%s", err);
    parse("{\"Version\":1,\"AccessKeyId\":\"A\",\"SecretAccessKey\":\"TOPSECRET\","
          "\"Expiration\":\"tomorrow\"}",
          CREDS_JSON_PROCESS, -EINVAL, err);
    cr_expect(strstr(err, "Expiration"), "%s", err);
    cr_expect(!strstr(err, "TOPSECRET"));
    parse("TOPSECRET not json", CREDS_JSON_PROCESS, -EINVAL, err);
    cr_expect(strstr(err, "not a JSON object"), "%s", err);
    cr_expect(!strstr(err, "TOPSECRET"), "%s", err);
    parse("[1,2]", CREDS_JSON_CONTAINER, -EINVAL, err);
    size_t big = CREDS_MAX_RESPONSE + 1;
    char *huge = malloc(big + 1);
    memset(huge, ' ', big);
    huge[big] = '\0';
    parse(huge, CREDS_JSON_IMDS, -EFBIG, err);
    free(huge);
}

Test(creds, imds_and_container_json)
{
    char err[256];
    struct creds *c = parse("{\"Code\":\"Success\",\"LastUpdated\":\"2026-12-01T05:00:00Z\","
                            "\"Type\":\"AWS-HMAC\",\"AccessKeyId\":\"ASIAIMDS\","
                            "\"SecretAccessKey\":\"s\",\"Token\":\"tok\","
                            "\"Expiration\":\"2026-12-01T11:00:00Z\"}",
                            CREDS_JSON_IMDS, 0, err);
    cr_assert_not_null(c);
    cr_expect_str_eq(c->session_token, "tok");
    cr_expect_eq(c->expiration, (time_t)1796104800 + 5 * 3600);
    creds_unref(c);
    parse("{\"Code\":\"AssumeRoleUnauthorizedAccess\",\"AccessKeyId\":\"A\","
          "\"SecretAccessKey\":\"s\"}",
          CREDS_JSON_IMDS, -EINVAL, err);
    cr_expect(strstr(err, "AssumeRoleUnauthorizedAccess"), "%s", err);
    c = parse("{\"AccessKeyId\":\"ASIACONT\",\"SecretAccessKey\":\"s\",\"Token\":\"tok\","
              "\"Expiration\":\"2026-12-01T06:00:00.123+01:00\",\"RoleArn\":\"x\"}",
              CREDS_JSON_CONTAINER, 0, err);
    cr_assert_not_null(c);
    cr_expect_eq(c->expiration, (time_t)1796104800 - 3600);
    creds_unref(c);
}

Test(creds, times)
{
    time_t t;
    cr_expect_eq(creds_parse_time("1970-01-01T00:00:00Z", &t), 0);
    cr_expect_eq(t, 0);
    cr_expect_eq(creds_parse_time("2026-12-01T06:00:00.5Z", &t), 0);
    cr_expect_eq(t, (time_t)1796104800);
    cr_expect_eq(creds_parse_time("2026-12-01T06:00:00-0030", &t), 0);
    cr_expect_eq(t, (time_t)1796104800 + 1800);
    const char *bad[] = {"",
                         "2026-12-01",
                         "2026-12-01T06:00:00",
                         "2026-13-01T06:00:00Z",
                         "2026-12-01T06:00:00Zjunk",
                         "2026-12-01 06:00:00Z",
                         "2026-12-01T06:00:00.Z",
                         "1796104800"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_expect_eq(creds_parse_time(bad[i], &t), -EINVAL, "accepted '%s'", bad[i]);
}

static const char *STS_OK =
    "<AssumeRoleWithWebIdentityResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\">"
    "<AssumeRoleWithWebIdentityResult><SubjectFromWebIdentityToken>x</"
    "SubjectFromWebIdentityToken>"
    "<Credentials><SessionToken>tok</SessionToken><SecretAccessKey>sec</SecretAccessKey>"
    "<Expiration>2026-12-01T06:00:00Z</Expiration><AccessKeyId>ASIASTS</AccessKeyId>"
    "</Credentials></AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>";

Test(creds, sts_xml)
{
    char err[256] = "";
    struct creds *c = NULL;
    cr_assert_eq(creds_parse_sts_xml(STS_OK, strlen(STS_OK), &c, err, sizeof err), 0, "%s", err);
    cr_expect_str_eq(c->access_key_id, "ASIASTS");
    cr_expect_str_eq(c->secret_access_key, "sec");
    cr_expect_str_eq(c->session_token, "tok");
    cr_expect_eq(c->expiration, (time_t)1796104800);
    creds_unref(c);

    const char *e = "<ErrorResponse><Error><Type>Sender</Type><Code>InvalidIdentityToken</Code>"
                    "<Message>Token expired</Message></Error></ErrorResponse>";
    cr_expect_eq(creds_parse_sts_xml(e, strlen(e), &c, err, sizeof err), -EACCES);
    cr_expect_str_eq(err, "STS: InvalidIdentityToken: Token expired");
    cr_expect_null(c);

    const char *nocred = "<AssumeRoleResponse><AssumeRoleResult/></AssumeRoleResponse>";
    cr_expect_eq(creds_parse_sts_xml(nocred, strlen(nocred), &c, err, sizeof err), -EINVAL);
    cr_expect(strstr(err, "no Credentials"), "%s", err);
    const char *noexp = "<R><Credentials><AccessKeyId>A</AccessKeyId><SecretAccessKey>s"
                        "</SecretAccessKey><SessionToken>t</SessionToken></Credentials></R>";
    cr_expect_eq(creds_parse_sts_xml(noexp, strlen(noexp), &c, err, sizeof err), -EINVAL);
    cr_expect(strstr(err, "Expiration"), "%s", err);
    const char *dtd = "<!DOCTYPE R [<!ENTITY x \"y\">]><R><Credentials/></R>";
    cr_expect_eq(creds_parse_sts_xml(dtd, strlen(dtd), &c, err, sizeof err), -EINVAL);
    cr_expect(strstr(err, "DTD"), "%s", err);
    cr_expect_eq(creds_parse_sts_xml("", 0, &c, err, sizeof err), -EINVAL);
    cr_expect_eq(creds_parse_sts_xml("<a>", 3, &c, err, sizeof err), -EINVAL);
    cr_expect_eq(creds_parse_sts_xml(STS_OK, CREDS_MAX_RESPONSE + 1, &c, err, sizeof err), -EFBIG);
}

Test(creds, refresh_schedule)
{
    /* an hour: 5 min before expiry */
    cr_expect_eq(creds_refresh_at(1000, 1000 + 3600), 1000 + 3600 - 300);
    /* 6 h (IMDS) */
    cr_expect_eq(creds_refresh_at(0, 21600), 21600 - 300);
    /* shorter than 10 min: half-way */
    cr_expect_eq(creds_refresh_at(1000, 1000 + 8), 1000 + 4);
    cr_expect_eq(creds_refresh_at(1000, 1000 + 600), 1000 + 300);
    /* already expired or about to: not before a second has passed */
    cr_expect_eq(creds_refresh_at(1000, 999), 1001);
    cr_expect_eq(creds_refresh_at(1000, 1001), 1001);
}

Test(creds, retry_backoff)
{
    /* far from expiry: 1, 2, 4, ... capped at 60 */
    cr_expect_eq(creds_retry_delay(1, 0, 3600), 1);
    cr_expect_eq(creds_retry_delay(2, 0, 3600), 2);
    cr_expect_eq(creds_retry_delay(3, 0, 3600), 4);
    cr_expect_eq(creds_retry_delay(7, 0, 3600), 60);
    cr_expect_eq(creds_retry_delay(100, 0, 3600), 60);
    /* close to expiry: at most half of what is left, at least 1 s */
    cr_expect_eq(creds_retry_delay(7, 0, 40), 20);
    cr_expect_eq(creds_retry_delay(7, 0, 1), 1);
    /* expired: the cap */
    cr_expect_eq(creds_retry_delay(7, 100, 50), 60);
}

Test(creds, refcounts_outlive_swaps)
{
    struct creds *a = creds_new("A", "s", NULL, 0);
    struct creds *b = creds_ref(a);
    cr_expect_eq(atomic_load(&a->refs), 2);
    creds_unref(a);
    cr_expect_str_eq(b->access_key_id, "A");
    creds_unref(b);
}

/* A credential_process that prints generation N (a counter file) with an
 * expiry `life` seconds ahead; fails while a "fail" file exists. */
static void write_helper(const char *dir, int life)
{
    char path[512];
    snprintf(path, sizeof path, "%s/helper.sh", dir);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f,
            "#!/bin/sh\n"
            "d=%s\n"
            "[ -e $d/fail ] && { echo 'helper: told to fail' >&2; exit 3; }\n"
            "n=$(cat $d/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > $d/n\n"
            "exp=$(date -u -d @$(( $(date +%%s) + %d )) +%%Y-%%m-%%dT%%H:%%M:%%SZ)\n"
            "printf '{\"Version\":1,\"AccessKeyId\":\"ASIAGEN%%d\",\"SecretAccessKey\":\"s%%d\","
            "\"SessionToken\":\"t%%d\",\"Expiration\":\"%%s\"}' $n $n $n $exp\n",
            dir, life);
    fclose(f);
}

static struct creds_provider *process_provider(const char *dir, char *err)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "sh %s/helper.sh", dir);
    struct aws_config cfg = {.cred_source = AWS_CRED_PROCESS,
                             .credential_process = cmd,
                             .region = "us-east-1",
                             .profile = "p"};
    struct creds_provider *p = NULL;
    int rc = creds_provider_create(&cfg, &p, err, 512);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_not_null(p);
    return p;
}

Test(creds, provider_refreshes_and_keeps_old_references)
{
    char dir[] = "/tmp/ckptfs-creds-XXXXXX", err[512] = "";
    cr_assert_not_null(mkdtemp(dir));
    write_helper(dir, 4); /* refresh due ~2 s after each fetch */
    struct creds_provider *p = process_provider(dir, err);
    struct creds *first = creds_provider_get(p);
    cr_expect_str_eq(first->access_key_id, "ASIAGEN1");
    /* requests every 0.25 s for 7 s: never signed with expired credentials */
    for (int i = 0; i < 28; i++) {
        usleep(250000);
        struct creds *c = creds_provider_get(p);
        cr_expect(c->expiration > time(NULL), "got expired credentials (%s)", c->access_key_id);
        creds_unref(c);
    }
    struct creds *later = creds_provider_get(p);
    cr_expect_neq(later, first);
    cr_expect(creds_provider_refreshes(p) >= 2, "refreshes %lu", creds_provider_refreshes(p));
    /* the old reference is still intact after being swapped out */
    cr_expect_str_eq(first->access_key_id, "ASIAGEN1");
    cr_expect_str_eq(first->session_token, "t1");
    creds_unref(first);
    creds_unref(later);
    creds_provider_destroy(p);
    rm_tree(dir);
}

Test(creds, failed_refresh_keeps_old_credentials_then_recovers)
{
    char dir[] = "/tmp/ckptfs-creds-XXXXXX", err[512] = "", path[600];
    cr_assert_not_null(mkdtemp(dir));
    write_helper(dir, 10); /* refresh due at ~5 s */
    struct creds_provider *p = process_provider(dir, err);
    snprintf(path, sizeof path, "%s/fail", dir);
    FILE *f = fopen(path, "w");
    fclose(f);
    sleep(7);
    struct creds *c = creds_provider_get(p); /* starts a refresh, which fails */
    cr_expect_str_eq(c->access_key_id, "ASIAGEN1");
    creds_unref(c);
    sleep(1);
    c = creds_provider_get(p);
    cr_expect_str_eq(c->access_key_id, "ASIAGEN1"); /* still the old, valid ones */
    cr_expect_eq(creds_provider_refreshes(p), 0);
    creds_unref(c);
    sleep(1);
    unlink(path);
    sleep(3); /* now expired: the next get refreshes (the retry is due) and waits for it */
    c = creds_provider_get(p);
    cr_expect_str_eq(c->access_key_id, "ASIAGEN2");
    cr_expect(c->expiration > time(NULL));
    cr_expect_eq(creds_provider_refreshes(p), 1);
    creds_unref(c);
    creds_provider_destroy(p);
    rm_tree(dir);
}

Test(creds, broken_process_fails_create_with_one_line)
{
    struct aws_config cfg = {.cred_source = AWS_CRED_PROCESS,
                             .credential_process = "echo '{\"Version\":1}'",
                             .region = "us-east-1"};
    struct creds_provider *p = NULL;
    char err[512] = "";
    cr_expect_eq(creds_provider_create(&cfg, &p, err, sizeof err), -EINVAL);
    cr_expect_null(p);
    cr_expect_str_eq(err, "credentials from credential_process: credential_process output: "
                          "AccessKeyId is missing");
    cfg.credential_process = "exit 7";
    cr_expect_eq(creds_provider_create(&cfg, &p, err, sizeof err), -EIO);
    cr_expect(strstr(err, "exit status 7"), "%s", err);
    cr_expect_null(strchr(err, '\n'));
}
