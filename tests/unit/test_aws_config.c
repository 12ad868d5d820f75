/*
 * tests/unit/test_aws_config.c - AWS configuration precedence (options,
 * environment, shared files), the INI reader, and redaction. Each test runs
 * in its own process (criterion forks), with a private HOME and a clean
 * AWS_* environment. Secrets are compared without ever being printed.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "aws_config.h"
#include "test_util.h"

static char home[256];

static void write_file(const char *name, const char *text)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/.aws", home);
    write_text(dir, name, text);
}

static void clean_env(void)
{
    const char *vars[] = {"AWS_ACCESS_KEY_ID",
                          "AWS_SECRET_ACCESS_KEY",
                          "AWS_SESSION_TOKEN",
                          "AWS_SECURITY_TOKEN",
                          "AWS_PROFILE",
                          "AWS_DEFAULT_PROFILE",
                          "AWS_REGION",
                          "AWS_DEFAULT_REGION",
                          "AWS_ENDPOINT_URL",
                          "AWS_ENDPOINT_URL_S3",
                          "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS",
                          "AWS_SHARED_CREDENTIALS_FILE",
                          "AWS_CONFIG_FILE",
                          "AWS_ROLE_ARN",
                          "AWS_WEB_IDENTITY_TOKEN_FILE",
                          "AWS_ROLE_SESSION_NAME",
                          "AWS_ENDPOINT_URL_STS",
                          "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                          "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                          "AWS_CONTAINER_AUTHORIZATION_TOKEN",
                          "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
                          "AWS_EC2_METADATA_SERVICE_ENDPOINT"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        unsetenv(vars[i]);
}

static void setup(void)
{
    snprintf(home, sizeof home, "/tmp/ckptfs-awscfg-XXXXXX");
    cr_assert_not_null(mkdtemp(home));
    char aws[300];
    snprintf(aws, sizeof aws, "%s/.aws", home);
    cr_assert_eq(mkdir(aws, 0700), 0);
    clean_env();
    setenv("HOME", home, 1);
    setenv("AWS_EC2_METADATA_DISABLED", "true", 1); /* tests that want IMDS unset it */
}

static void teardown(void)
{
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", home);
    cr_expect_eq(system(cmd), 0);
}

TestSuite(aws_config, .init = setup, .fini = teardown);

/* Compare a secret without printing it. */
#define expect_secret(got, want) cr_expect((got) && strcmp((got), (want)) == 0, "secret mismatch")

static const char *CREDS = "[default]\n"
                           "aws_access_key_id = AKIDFILEDEFAULT00001\n"
                           "aws_secret_access_key = file-default-secret\n"
                           "\n"
                           "[dev]\n"
                           "aws_access_key_id=AKIDFILEDEV000000001\n"
                           "aws_secret_access_key=file-dev-secret\n"
                           "aws_session_token=file-dev-token\n";

static const char *CONFIG = "[default]\n"
                            "region = eu-central-1\n"
                            "\n"
                            "[profile dev]\n"
                            "region = ap-south-1\n"
                            "endpoint_url = http://dev-global:9000\n"
                            "\n"
                            "[profile cfgonly]\n"
                            "aws_access_key_id = AKIDCONFIGONLY000001\n"
                            "aws_secret_access_key = config-only-secret\n"
                            "region = us-west-2\n"
                            "s3 =\n"
                            "  endpoint_url = http://nested-s3:9000\n"
                            "  addressing_style = path\n"
                            "\n"
                            "[profile svc]\n"
                            "services = local\n"
                            "endpoint_url = http://global:1\n"
                            "\n"
                            "[services local]\n"
                            "s3 =\n"
                            "  endpoint_url = http://services-s3:4568\n"
                            "\n"
                            "[profile role]\n"
                            "role_arn = arn:aws:iam::123456789012:role/x\n"
                            "source_profile = default\n";

static int resolve(const char *endpoint, const char *region, const char *profile,
                   struct aws_config *c, char *err)
{
    struct aws_config_overrides ov = {endpoint, region, profile};
    return aws_config_resolve(&ov, c, err, 256);
}

Test(aws_config, nothing_anywhere_is_anonymous_us_east_1)
{
    struct aws_config c;
    char err[256];
    cr_assert_eq(resolve(NULL, NULL, NULL, &c, err), 0, "%s", err);
    cr_expect_null(c.access_key_id);
    cr_expect_null(c.secret_access_key);
    cr_expect_eq(c.cred_source, AWS_CRED_NONE);
    cr_expect_str_eq(c.region, "us-east-1");
    cr_expect_str_eq(c.region_source, "default");
    cr_expect_null(c.endpoint_url);
    cr_expect_str_eq(c.profile, "default");
    aws_config_free(&c);
}

Test(aws_config, env_credentials_win_over_files)
{
    write_file("credentials", CREDS);
    write_file("config", CONFIG);
    setenv("AWS_ACCESS_KEY_ID", "AKIDENV0000000000001", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "env-secret", 1);
    setenv("AWS_SESSION_TOKEN", "env-token", 1);
    struct aws_config c;
    char err[256];
    cr_assert_eq(resolve(NULL, NULL, NULL, &c, err), 0);
    cr_expect_str_eq(c.access_key_id, "AKIDENV0000000000001");
    expect_secret(c.secret_access_key, "env-secret");
    expect_secret(c.session_token, "env-token");
    cr_expect_eq(c.cred_source, AWS_CRED_ENV);
    cr_expect_str_eq(c.region, "eu-central-1", "region still comes from the default profile");
    aws_config_free(&c);
}

Test(aws_config, aws_profile_env_does_not_beat_env_keys)
{
    write_file("credentials", CREDS);
    setenv("AWS_PROFILE", "dev", 1);
    setenv("AWS_ACCESS_KEY_ID", "AKIDENV0000000000001", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "env-secret", 1);
    struct aws_config c;
    char err[256];
    cr_assert_eq(resolve(NULL, NULL, NULL, &c, err), 0);
    cr_expect_eq(c.cred_source, AWS_CRED_ENV);
    cr_expect_str_eq(c.profile, "dev");
    cr_expect_null(c.session_token);
    aws_config_free(&c);
}

Test(aws_config, explicit_profile_beats_env_keys)
{
    write_file("credentials", CREDS);
    write_file("config", CONFIG);
    setenv("AWS_ACCESS_KEY_ID", "AKIDENV0000000000001", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "env-secret", 1);
    struct aws_config c;
    char err[256];
    cr_assert_eq(resolve(NULL, NULL, "dev", &c, err), 0);
    cr_expect_str_eq(c.access_key_id, "AKIDFILEDEV000000001");
    expect_secret(c.secret_access_key, "file-dev-secret");
    expect_secret(c.session_token, "file-dev-token");
    cr_expect_eq(c.cred_source, AWS_CRED_CREDENTIALS_FILE);
    cr_expect_str_eq(c.region, "ap-south-1");
    cr_expect_str_eq(c.region_source, "config file");
    cr_expect_str_eq(c.endpoint_url, "http://dev-global:9000");
    aws_config_free(&c);
}

Test(aws_config, aws_profile_selects_file_profile)
{
    write_file("credentials", CREDS);
    write_file("config", CONFIG);
    setenv("AWS_PROFILE", "dev", 1);
    struct aws_config c;
    char err[256];
    cr_assert_eq(resolve(NULL, NULL, NULL, &c, err), 0);
    cr_expect_str_eq(c.access_key_id, "AKIDFILEDEV000000001");
    cr_expect_str_eq(c.region, "ap-south-1");
    aws_config_free(&c);
}

Test(aws_config, partial_env_keys_are_ignored)
{
    write_file("credentials", CREDS);
    setenv("AWS_ACCESS_KEY_ID", "AKIDENV0000000000001", 1);
    struct aws_config c;
    char err[256];
    cr_assert_eq(resolve(NULL, NULL, NULL, &c, err), 0);
    cr_expect_str_eq(c.access_key_id, "AKIDFILEDEFAULT00001");
    cr_expect_eq(c.cred_source, AWS_CRED_CREDENTIALS_FILE);
    aws_config_free(&c);
}

Test(aws_config, config_file_credentials_and_nested_s3_settings)
{
    write_file("credentials", CREDS);
    write_file("config", CONFIG);
    struct aws_config c;
    char err[256];
    cr_assert_eq(resolve(NULL, NULL, "cfgonly", &c, err), 0, "%s", err);
    cr_expect_str_eq(c.access_key_id, "AKIDCONFIGONLY000001");
    expect_secret(c.secret_access_key, "config-only-secret");
    cr_expect_eq(c.cred_source, AWS_CRED_CONFIG_FILE);
    cr_expect_str_eq(c.region, "us-west-2");
    cr_expect_str_eq(c.endpoint_url, "http://nested-s3:9000");
    cr_expect_eq(c.addressing, AWS_ADDR_PATH);
    aws_config_free(&c);
}

Test(aws_config, credentials_file_beats_config_file)
{
    write_file("credentials", "[cfgonly]\naws_access_key_id = AKIDCREDSWIN00000001\n"
                              "aws_secret_access_key = creds-secret\n");
    write_file("config", CONFIG);
    struct aws_config c;
    char err[256];
    cr_assert_eq(resolve(NULL, NULL, "cfgonly", &c, err), 0);
    cr_expect_str_eq(c.access_key_id, "AKIDCREDSWIN00000001");
    cr_expect_eq(c.cred_source, AWS_CRED_CREDENTIALS_FILE);
    aws_config_free(&c);
}

Test(aws_config, region_precedence)
{
    write_file("config", CONFIG);
    struct aws_config c;
    char err[256];
    setenv("AWS_DEFAULT_REGION", "ca-central-1", 1);
    cr_assert_eq(resolve(NULL, NULL, NULL, &c, err), 0);
    cr_expect_str_eq(c.region, "ca-central-1");
    aws_config_free(&c);
    setenv("AWS_REGION", "sa-east-1", 1);
    cr_assert_eq(resolve(NULL, NULL, NULL, &c, err), 0);
    cr_expect_str_eq(c.region, "sa-east-1");
    cr_expect_str_eq(c.region_source, "AWS_REGION");
    aws_config_free(&c);
    cr_assert_eq(resolve(NULL, "me-south-1", NULL, &c, err), 0);
    cr_expect_str_eq(c.region, "me-south-1");
    cr_expect_str_eq(c.region_source, "--region");
    aws_config_free(&c);
}

Test(aws_config, endpoint_precedence)
{
    write_file("config", CONFIG);
    struct aws_config c;
    char err[256];
    cr_assert_eq(resolve(NULL, NULL, "svc", &c, err), 0);
    cr_expect_str_eq(c.endpoint_url, "http://services-s3:4568", "services section wins");
    aws_config_free(&c);
    setenv("AWS_ENDPOINT_URL", "http://env-global:2", 1);
    cr_assert_eq(resolve(NULL, NULL, "svc", &c, err), 0);
    cr_expect_str_eq(c.endpoint_url, "http://env-global:2");
    aws_config_free(&c);
    setenv("AWS_ENDPOINT_URL_S3", "http://env-s3:3", 1);
    cr_assert_eq(resolve(NULL, NULL, "svc", &c, err), 0);
    cr_expect_str_eq(c.endpoint_url, "http://env-s3:3");
    cr_expect_str_eq(c.endpoint_source, "AWS_ENDPOINT_URL_S3");
    aws_config_free(&c);
    cr_assert_eq(resolve("http://option:4", NULL, "svc", &c, err), 0);
    cr_expect_str_eq(c.endpoint_url, "http://option:4");
    aws_config_free(&c);
    setenv("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true", 1);
    cr_assert_eq(resolve(NULL, NULL, "svc", &c, err), 0);
    cr_expect_null(c.endpoint_url);
    aws_config_free(&c);
    cr_assert_eq(resolve("http://option:4", NULL, "svc", &c, err), 0);
    cr_expect_str_eq(c.endpoint_url, "http://option:4", "an explicit option is never ignored");
    aws_config_free(&c);
}

Test(aws_config, file_locations_from_env)
{
    char cpath[512], fpath[512];
    snprintf(cpath, sizeof cpath, "%s/elsewhere-creds", home);
    snprintf(fpath, sizeof fpath, "%s/elsewhere-config", home);
    FILE *f = fopen(cpath, "w");
    fputs("[default]\naws_access_key_id=AKIDELSEWHERE0000001\naws_secret_access_key=s\n", f);
    fclose(f);
    f = fopen(fpath, "w");
    fputs("[default]\nregion=af-south-1\n", f);
    fclose(f);
    write_file("credentials", CREDS);
    setenv("AWS_SHARED_CREDENTIALS_FILE", cpath, 1);
    setenv("AWS_CONFIG_FILE", fpath, 1);
    struct aws_config c;
    char err[256];
    cr_assert_eq(resolve(NULL, NULL, NULL, &c, err), 0);
    cr_expect_str_eq(c.access_key_id, "AKIDELSEWHERE0000001");
    cr_expect_str_eq(c.region, "af-south-1");
    aws_config_free(&c);
}

Test(aws_config, profile_default_section_spelling)
{
    write_file("config", "[profile default]\nregion = eu-north-1\n");
    struct aws_config c;
    char err[256];
    cr_assert_eq(resolve(NULL, NULL, NULL, &c, err), 0);
    cr_expect_str_eq(c.region, "eu-north-1");
    aws_config_free(&c);
}

Test(aws_config, missing_named_profile_is_an_error)
{
    write_file("credentials", CREDS);
    struct aws_config c;
    char err[256];
    cr_expect_eq(resolve(NULL, NULL, "nope", &c, err), -ENOENT);
    cr_expect(strstr(err, "'nope'") != NULL, "%s", err);
    setenv("AWS_PROFILE", "nope2", 1);
    cr_expect_eq(resolve(NULL, NULL, NULL, &c, err), -ENOENT);
}

Test(aws_config, unsupported_mechanism_is_reported)
{
    write_file("config", "[profile sso]\nsso_start_url = https://example.awsapps.com/start\n");
    struct aws_config c;
    char err[512];
    cr_expect_eq(
        aws_config_resolve(&(struct aws_config_overrides){.profile = "sso"}, &c, err, sizeof err),
        -ENOTSUP);
    cr_expect(strstr(err, "sso_start_url") != NULL, "%s", err);
}

/* The chain in the SDKs' order: env, web identity, profile, container, IMDS. */
Test(aws_config, chain_order)
{
    write_file("credentials", CREDS);
    write_file("config", CONFIG);
    struct aws_config c;
    char err[512];
    setenv("AWS_ACCESS_KEY_ID", "AKIDENV0000000000001", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "env-secret", 1);
    setenv("AWS_ROLE_ARN", "arn:aws:iam::1:role/web", 1);
    setenv("AWS_WEB_IDENTITY_TOKEN_FILE", "/tmp/token", 1);
    setenv("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "/v2/creds", 1);
    unsetenv("AWS_EC2_METADATA_DISABLED");
    cr_assert_eq(resolve(NULL, NULL, NULL, &c, err), 0, "%s", err);
    cr_expect_eq(c.cred_source, AWS_CRED_ENV);
    aws_config_free(&c);
    unsetenv("AWS_ACCESS_KEY_ID");
    cr_assert_eq(resolve(NULL, NULL, NULL, &c, err), 0, "%s", err);
    cr_expect_eq(c.cred_source, AWS_CRED_WEB_IDENTITY);
    cr_expect_str_eq(c.role_arn, "arn:aws:iam::1:role/web");
    cr_expect_str_eq(c.web_identity_token_file, "/tmp/token");
    cr_expect_null(c.sts_endpoint);
    aws_config_free(&c);
    setenv("AWS_ENDPOINT_URL_STS", "http://127.0.0.1:1/", 1);
    cr_assert_eq(resolve(NULL, NULL, NULL, &c, err), 0, "%s", err);
    cr_expect_str_eq(c.sts_endpoint, "http://127.0.0.1:1/");
    aws_config_free(&c);
    unsetenv("AWS_ROLE_ARN");
    cr_assert_eq(resolve(NULL, NULL, NULL, &c, err), 0, "%s", err);
    cr_expect_eq(c.cred_source, AWS_CRED_CREDENTIALS_FILE);
    aws_config_free(&c);
    write_file("credentials", "");
    write_file("config", "");
    cr_assert_eq(resolve(NULL, NULL, NULL, &c, err), 0, "%s", err);
    cr_expect_eq(c.cred_source, AWS_CRED_CONTAINER);
    cr_expect_str_eq(c.container_url, "http://169.254.170.2/v2/creds");
    aws_config_free(&c);
    unsetenv("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI");
    cr_assert_eq(resolve(NULL, NULL, NULL, &c, err), 0, "%s", err);
    cr_expect_eq(c.cred_source, AWS_CRED_IMDS);
    cr_expect_str_eq(c.imds_endpoint, "http://169.254.169.254");
    aws_config_free(&c);
    setenv("AWS_EC2_METADATA_DISABLED", "true", 1);
    cr_assert_eq(resolve(NULL, NULL, NULL, &c, err), 0, "%s", err);
    cr_expect_eq(c.cred_source, AWS_CRED_NONE);
    aws_config_free(&c);
}

Test(aws_config, profile_mechanisms)
{
    write_file("credentials", CREDS);
    write_file("config", "[profile proc]\ncredential_process = /bin/helper --x\n"
                         "[profile role]\nrole_arn = arn:aws:iam::1:role/r\n"
                         "source_profile = dev\nrole_session_name = s1\n"
                         "sts =\n  endpoint_url = http://sts.local:1\n"
                         "[profile webid]\nrole_arn = arn:aws:iam::1:role/w\n"
                         "web_identity_token_file = /t\n"
                         "[profile nosrc]\nrole_arn = arn:aws:iam::1:role/r\n"
                         "source_profile = missing\n");
    struct aws_config c;
    char err[512];
    cr_assert_eq(resolve(NULL, NULL, "proc", &c, err), 0, "%s", err);
    cr_expect_eq(c.cred_source, AWS_CRED_PROCESS);
    cr_expect_str_eq(c.credential_process, "/bin/helper --x");
    aws_config_free(&c);
    cr_assert_eq(resolve(NULL, NULL, "role", &c, err), 0, "%s", err);
    cr_expect_eq(c.cred_source, AWS_CRED_ASSUME_ROLE);
    cr_expect_str_eq(c.access_key_id, "AKIDFILEDEV000000001"); /* the source's keys sign */
    cr_expect_str_eq(c.role_session_name, "s1");
    cr_expect_str_eq(c.sts_endpoint, "http://sts.local:1");
    aws_config_free(&c);
    cr_assert_eq(resolve(NULL, NULL, "webid", &c, err), 0, "%s", err);
    cr_expect_eq(c.cred_source, AWS_CRED_WEB_IDENTITY);
    aws_config_free(&c);
    cr_expect_eq(resolve(NULL, NULL, "nosrc", &c, err), -ENOENT);
    cr_expect(strstr(err, "source_profile 'missing'") != NULL, "%s", err);
}

Test(aws_config, errors_never_contain_secrets)
{
    write_file("credentials", "[default]\naws_secret_access_key = TOPSECRETVALUE\n"
                              "sso_session = corp\n");
    struct aws_config c;
    char err[256];
    int rc = resolve(NULL, NULL, NULL, &c, err);
    cr_expect_eq(rc, -ENOTSUP);
    cr_expect(strstr(err, "TOPSECRETVALUE") == NULL, "secret leaked into the message");
}

Test(aws_config, unreadable_file_is_an_error)
{
    char path[512];
    snprintf(path, sizeof path, "%s/.aws/credentials", home);
    cr_assert_eq(mkdir(path, 0700), 0); /* a directory, not a file */
    struct aws_config c;
    char err[256];
    cr_expect_eq(resolve(NULL, NULL, NULL, &c, err), -EINVAL);
    cr_expect(strstr(err, "credentials") != NULL, "%s", err);
}

/* ---- INI reader ---------------------------------------------------------- */

Test(aws_config, ini_parsing_rules)
{
    const char *text = "# comment\r\n"
                       "; another\r\n"
                       "orphan = ignored\r\n"
                       "[  profile    spaced  ]\r\n"
                       "  Region   =   us-east-2   \r\n"
                       "secret = a=b=c\r\n"
                       "colon: value\r\n"
                       "empty =\r\n"
                       "not a key line\r\n"
                       "[default]\n"
                       "region = first\n"
                       "region = second\n"
                       "s3 =\n"
                       "    max_concurrent_requests = 20\n"
                       "\taddressing_style = virtual\n"
                       "next = x\n"
                       "   indented_after_value = y\n";
    struct aws_ini ini;
    cr_assert_eq(aws_ini_parse(text, strlen(text), &ini), 0);
    cr_expect_null(aws_ini_get(&ini, "", "orphan"));
    cr_expect_str_eq(aws_ini_get(&ini, "profile spaced", "region"), "us-east-2");
    cr_expect_str_eq(aws_ini_get(&ini, "profile spaced", "REGION"), "us-east-2");
    cr_expect_str_eq(aws_ini_get(&ini, "profile spaced", "secret"), "a=b=c");
    cr_expect_str_eq(aws_ini_get(&ini, "profile spaced", "colon"), "value");
    cr_expect_str_eq(aws_ini_get(&ini, "profile spaced", "empty"), "");
    cr_expect_str_eq(aws_ini_get(&ini, "default", "region"), "second");
    cr_expect_str_eq(aws_ini_get(&ini, "default", "s3.addressing_style"), "virtual");
    cr_expect_str_eq(aws_ini_get(&ini, "default", "s3.max_concurrent_requests"), "20");
    cr_expect_null(aws_ini_get(&ini, "default", "next.indented_after_value"));
    cr_expect(aws_ini_has_section(&ini, "default"));
    cr_expect(!aws_ini_has_section(&ini, "nope"));
    aws_ini_free(&ini);
}

Test(aws_config, ini_limits)
{
    struct aws_ini ini;
    size_t n = AWS_INI_MAX_LINE + 10;
    char *line = malloc(n + 16);
    memcpy(line, "[a]\nk = ", 8);
    memset(line + 8, 'x', n);
    line[8 + n] = '\0';
    cr_expect_eq(aws_ini_parse(line, strlen(line), &ini), -EFBIG);
    free(line);
    cr_expect_eq(aws_ini_parse("x", AWS_INI_MAX_BYTES + 1, &ini), -EFBIG);
    cr_expect_eq(aws_ini_parse("[a]\nk=v\0w\n", 10, &ini), -EINVAL);
    /* too many entries */
    size_t cap = (AWS_INI_MAX_ENTRIES + 10) * 8 + 8, len = 0;
    char *many = malloc(cap);
    len += (size_t)snprintf(many, cap, "[s]\n");
    for (int i = 0; i < AWS_INI_MAX_ENTRIES + 5; i++)
        len += (size_t)snprintf(many + len, cap - len, "k=v\n");
    cr_expect_eq(aws_ini_parse(many, len, &ini), -EFBIG);
    free(many);
}

Test(aws_config, ini_load_missing_file_is_empty)
{
    struct aws_ini ini;
    cr_expect_eq(aws_ini_load("/nonexistent/dir/credentials", &ini), 0);
    cr_expect_eq(ini.n, 0);
    aws_ini_free(&ini);
}

Test(aws_config, ini_load_refuses_huge_file)
{
    char path[512];
    snprintf(path, sizeof path, "%s/.aws/config", home);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    cr_assert_eq(fseek(f, AWS_INI_MAX_BYTES + 1, SEEK_SET), 0);
    fputc('\n', f);
    fclose(f);
    struct aws_ini ini;
    cr_expect_eq(aws_ini_load(path, &ini), -EFBIG);
}

/* ---- redaction ----------------------------------------------------------- */

Test(aws_config, redaction)
{
    char buf[64];
    cr_expect_str_eq(aws_redact("AKIAIOSFODNN7EXAMPLE", 1, buf, sizeof buf), "AKIA...MPLE");
    cr_expect_str_eq(aws_redact("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", 0, buf, sizeof buf),
                     "****");
    cr_expect_str_eq(aws_redact("short", 1, buf, sizeof buf), "****");
    cr_expect_str_eq(aws_redact(NULL, 1, buf, sizeof buf), "(none)");
    cr_expect_str_eq(aws_redact("", 0, buf, sizeof buf), "(none)");
    cr_expect_str_eq(aws_cred_source_name(AWS_CRED_ENV), "environment");
}
