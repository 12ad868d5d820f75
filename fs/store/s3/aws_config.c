/*
 * fs/store/s3/aws_config.c - AWS configuration resolution: explicit options, AWS_*
 * environment variables, shared credentials/config files (a small bounded
 * INI reader), and the redaction helper for logging credentials.
 *
 * Secrets read here are copied into struct aws_config only; nothing in this
 * file logs a secret key or a session token.
 */
#include "aws_config.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- INI ---------------------------------------------------------------- */

static char *dup_range(const char *a, const char *b)
{
    return strndup(a, (size_t)(b - a));
}

static void trim_range(const char **a, const char **b)
{
    while (*a < *b && (**a == ' ' || **a == '\t'))
        (*a)++;
    while (*b > *a && ((*b)[-1] == ' ' || (*b)[-1] == '\t' || (*b)[-1] == '\r'))
        (*b)--;
}

/* Section names with inner whitespace squeezed: "profile   dev" -> "profile dev". */
static char *section_name(const char *a, const char *b)
{
    char *s = malloc((size_t)(b - a) + 1), *w = s;
    if (!s)
        return NULL;
    int space = 0;
    for (; a < b; a++) {
        if (*a == ' ' || *a == '\t') {
            space = 1;
            continue;
        }
        if (space && w > s)
            *w++ = ' ';
        space = 0;
        *w++ = *a;
    }
    *w = '\0';
    return s;
}

static int ini_add(struct aws_ini *ini, const char *section, char *key, char *value)
{
    if (ini->n >= AWS_INI_MAX_ENTRIES) {
        free(key);
        free(value);
        return -EFBIG;
    }
    if (ini->n == ini->cap) {
        size_t ncap = ini->cap ? ini->cap * 2 : 32;
        struct aws_ini_entry *e = realloc(ini->entries, ncap * sizeof *e);
        if (!e) {
            free(key);
            free(value);
            return -ENOMEM;
        }
        ini->entries = e;
        ini->cap = ncap;
    }
    char *sec = strdup(section);
    if (!sec || !key || !value) {
        free(sec);
        free(key);
        free(value);
        return -ENOMEM;
    }
    for (char *p = key; *p; p++)
        if (*p >= 'A' && *p <= 'Z')
            *p = (char)(*p - 'A' + 'a');
    ini->entries[ini->n++] = (struct aws_ini_entry){sec, key, value};
    return 0;
}

struct ini_state {
    char *section; /* current section, NULL before the first */
    char *parent;  /* key with an empty value: indented lines nest under it */
};

/* key = value, or an indented "sub = value" nested under the parent key. */
static int ini_key_line(struct aws_ini *ini, struct ini_state *st, const char *a, const char *b,
                        int indented)
{
    const char *eq = a;
    while (eq < b && *eq != '=' && *eq != ':')
        eq++;
    if (eq == b || !st->section)
        return 0; /* not a key line, or outside any section: ignored */
    const char *ka = a, *kb = eq, *va = eq + 1, *vb = b;
    trim_range(&ka, &kb);
    trim_range(&va, &vb);
    if (ka == kb)
        return 0;
    char *key;
    if (indented && st->parent) {
        size_t pl = strlen(st->parent), kl = (size_t)(kb - ka);
        key = malloc(pl + 1 + kl + 1);
        if (key) {
            memcpy(key, st->parent, pl);
            key[pl] = '.';
            memcpy(key + pl + 1, ka, kl);
            key[pl + 1 + kl] = '\0';
        }
        return ini_add(ini, st->section, key, dup_range(va, vb));
    }
    free(st->parent);
    st->parent = va == vb ? dup_range(ka, kb) : NULL;
    return ini_add(ini, st->section, dup_range(ka, kb), dup_range(va, vb));
}

static int ini_line(struct aws_ini *ini, struct ini_state *st, const char *a, const char *b)
{
    int indented = a < b && (*a == ' ' || *a == '\t');
    trim_range(&a, &b);
    if (a == b || *a == '#' || *a == ';')
        return 0;
    if (*a == '[') {
        const char *close = memchr(a, ']', (size_t)(b - a));
        if (!close)
            return 0;
        const char *sa = a + 1, *sb = close;
        trim_range(&sa, &sb);
        free(st->section);
        free(st->parent);
        st->parent = NULL;
        st->section = section_name(sa, sb);
        return st->section ? 0 : -ENOMEM;
    }
    return ini_key_line(ini, st, a, b, indented);
}

int aws_ini_parse(const char *text, size_t len, struct aws_ini *ini)
{
    memset(ini, 0, sizeof *ini);
    if (len > AWS_INI_MAX_BYTES)
        return -EFBIG;
    struct ini_state st = {0};
    const char *p = text, *end = text + len;
    int rc = 0;
    while (p < end && rc == 0) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *eol = nl ? nl : end;
        if (eol - p > AWS_INI_MAX_LINE)
            rc = -EFBIG;
        else if (memchr(p, '\0', (size_t)(eol - p)))
            rc = -EINVAL;
        else
            rc = ini_line(ini, &st, p, eol);
        p = nl ? nl + 1 : end;
    }
    free(st.section);
    free(st.parent);
    if (rc < 0)
        aws_ini_free(ini);
    return rc;
}

int aws_ini_load(const char *path, struct aws_ini *ini)
{
    memset(ini, 0, sizeof *ini);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT || errno == ENOTDIR ? 0 : -errno;
    struct stat sb;
    if (fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return -EINVAL;
    }
    if (sb.st_size > (off_t)AWS_INI_MAX_BYTES) {
        close(fd);
        return -EFBIG;
    }
    size_t cap = (size_t)sb.st_size, len = 0;
    char *buf = malloc(cap + 1);
    if (!buf) {
        close(fd);
        return -ENOMEM;
    }
    while (len < cap) {
        ssize_t r = read(fd, buf + len, cap - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    close(fd);
    int rc = aws_ini_parse(buf, len, ini);
    OPENSSL_cleanse(buf, cap + 1);
    free(buf);
    return rc;
}

const char *aws_ini_get(const struct aws_ini *ini, const char *section, const char *key)
{
    const char *v = NULL;
    for (size_t i = 0; i < ini->n; i++)
        if (strcmp(ini->entries[i].section, section) == 0 &&
            strcasecmp(ini->entries[i].key, key) == 0)
            v = ini->entries[i].value;
    return v;
}

int aws_ini_has_section(const struct aws_ini *ini, const char *section)
{
    for (size_t i = 0; i < ini->n; i++)
        if (strcmp(ini->entries[i].section, section) == 0)
            return 1;
    return 0;
}

static void free_secret(char *s)
{
    if (s) {
        OPENSSL_cleanse(s, strlen(s));
        free(s);
    }
}

void aws_ini_free(struct aws_ini *ini)
{
    if (!ini)
        return;
    for (size_t i = 0; i < ini->n; i++) {
        free(ini->entries[i].section);
        free(ini->entries[i].key);
        free_secret(ini->entries[i].value);
    }
    free(ini->entries);
    memset(ini, 0, sizeof *ini);
}

/* ---- resolution --------------------------------------------------------- */

/* An environment variable, NULL if unset or empty. */
static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

static const char *nonempty(const char *s)
{
    return s && *s ? s : NULL;
}

/* The shared files and the section names of the profile in each. */
struct shared_files {
    char cred_path[4096];
    char config_path[4096];
    struct aws_ini cred;
    struct aws_ini config;
    char config_section[512]; /* "default" or "profile NAME" */
    const char *profile;
};

static void default_path(char *out, size_t len, const char *env_name, const char *file)
{
    const char *e = env(env_name);
    if (e) {
        snprintf(out, len, "%s", e);
        return;
    }
    const char *home = env("HOME");
    snprintf(out, len, "%s/.aws/%s", home ? home : ".", file);
}

static int load_shared(struct shared_files *f, char *err, size_t errlen)
{
    default_path(f->cred_path, sizeof f->cred_path, "AWS_SHARED_CREDENTIALS_FILE", "credentials");
    default_path(f->config_path, sizeof f->config_path, "AWS_CONFIG_FILE", "config");
    int rc = aws_ini_load(f->cred_path, &f->cred);
    if (rc < 0) {
        snprintf(err, errlen, "cannot read AWS credentials file %s: %s", f->cred_path,
                 strerror(-rc));
        return -EINVAL;
    }
    rc = aws_ini_load(f->config_path, &f->config);
    if (rc < 0) {
        snprintf(err, errlen, "cannot read AWS config file %s: %s", f->config_path, strerror(-rc));
        return -EINVAL;
    }
    if (strcmp(f->profile, "default") == 0 && !aws_ini_has_section(&f->config, "default"))
        snprintf(f->config_section, sizeof f->config_section, "profile default");
    else if (strcmp(f->profile, "default") == 0)
        snprintf(f->config_section, sizeof f->config_section, "default");
    else
        snprintf(f->config_section, sizeof f->config_section, "profile %s", f->profile);
    return 0;
}

static const char *cfg_get(const struct shared_files *f, const char *key)
{
    return nonempty(aws_ini_get(&f->config, f->config_section, key));
}

static int set_str(char **dst, const char *src)
{
    free_secret(*dst);
    *dst = src ? strdup(src) : NULL;
    return src && !*dst ? -ENOMEM : 0;
}

/* Keys from one INI section, if both the id and the secret are there. */
static int creds_from_ini(struct aws_config *c, const struct aws_ini *ini, const char *section)
{
    const char *id = nonempty(aws_ini_get(ini, section, "aws_access_key_id"));
    const char *secret = nonempty(aws_ini_get(ini, section, "aws_secret_access_key"));
    if (!id || !secret)
        return 0;
    const char *token = nonempty(aws_ini_get(ini, section, "aws_session_token"));
    if (!token)
        token = nonempty(aws_ini_get(ini, section, "aws_security_token"));
    if (set_str(&c->access_key_id, id) || set_str(&c->secret_access_key, secret) ||
        set_str(&c->session_token, token))
        return -ENOMEM;
    return 1;
}

static int creds_from_env(struct aws_config *c)
{
    const char *id = env("AWS_ACCESS_KEY_ID"), *secret = env("AWS_SECRET_ACCESS_KEY");
    if (!id || !secret)
        return 0;
    const char *token = env("AWS_SESSION_TOKEN");
    if (!token)
        token = env("AWS_SECURITY_TOKEN");
    if (set_str(&c->access_key_id, id) || set_str(&c->secret_access_key, secret) ||
        set_str(&c->session_token, token))
        return -ENOMEM;
    c->cred_source = AWS_CRED_ENV;
    return 1;
}

static int is_true(const char *v);

/* Credential mechanisms of the AWS CLI that ckptfs does not implement. */
static const char *unsupported_mechanism(const struct shared_files *f)
{
    static const char *keys[] = {"sso_session", "sso_start_url", "credential_source"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (cfg_get(f, keys[i]) || nonempty(aws_ini_get(&f->cred, f->profile, keys[i])))
            return keys[i];
    return NULL;
}

/* A profile setting from the config file, else from the credentials file. */
static const char *prof_get(const struct shared_files *f, const char *key)
{
    const char *v = cfg_get(f, key);
    return v ? v : nonempty(aws_ini_get(&f->cred, f->profile, key));
}

/* role_arn with source_profile: the source profile's static keys sign AssumeRole. */
static int creds_assume_role(struct aws_config *c, const struct shared_files *f, char *err,
                             size_t errlen)
{
    const char *src = prof_get(f, "source_profile");
    char section[512];
    snprintf(section, sizeof section, "profile %s", src);
    int rc = creds_from_ini(c, &f->cred, src);
    if (rc == 0)
        rc = creds_from_ini(c, &f->config, strcmp(src, "default") == 0 ? "default" : section);
    if (rc == 0 && strcmp(src, "default") == 0)
        rc = creds_from_ini(c, &f->config, section);
    if (rc < 0)
        return rc;
    if (rc == 0) {
        snprintf(err, errlen,
                 "profile '%s': source_profile '%s' has no aws_access_key_id/"
                 "aws_secret_access_key (only static keys can sign AssumeRole)",
                 f->profile, src);
        return -ENOENT;
    }
    c->cred_source = AWS_CRED_ASSUME_ROLE;
    return 0;
}

/* The profile's own mechanism: role_arn, static keys, credential_process. */
static int creds_from_profile(struct aws_config *c, const struct shared_files *f, char *err,
                              size_t errlen)
{
    const char *role = prof_get(f, "role_arn");
    if (role && !unsupported_mechanism(f)) {
        const char *tok = prof_get(f, "web_identity_token_file");
        if (set_str(&c->role_arn, role) ||
            set_str(&c->role_session_name, prof_get(f, "role_session_name")) ||
            set_str(&c->web_identity_token_file, tok))
            return -ENOMEM;
        if (tok) {
            c->cred_source = AWS_CRED_WEB_IDENTITY;
            return 1;
        }
        if (prof_get(f, "source_profile")) {
            int rc = creds_assume_role(c, f, err, errlen);
            return rc < 0 ? rc : 1;
        }
        snprintf(err, errlen,
                 "profile '%s' has role_arn but neither source_profile nor "
                 "web_identity_token_file",
                 f->profile);
        return -EINVAL;
    }
    int rc = creds_from_ini(c, &f->cred, f->profile);
    if (rc) {
        c->cred_source = AWS_CRED_CREDENTIALS_FILE;
        return rc;
    }
    rc = creds_from_ini(c, &f->config, f->config_section);
    if (rc) {
        c->cred_source = AWS_CRED_CONFIG_FILE;
        return rc;
    }
    const char *proc = prof_get(f, "credential_process");
    if (proc && !unsupported_mechanism(f)) {
        c->cred_source = AWS_CRED_PROCESS;
        return set_str(&c->credential_process, proc) ? -ENOMEM : 1;
    }
    return 0;
}

/* AWS_ROLE_ARN + AWS_WEB_IDENTITY_TOKEN_FILE (EKS IRSA and the like). */
static int creds_web_identity_env(struct aws_config *c)
{
    const char *role = env("AWS_ROLE_ARN"), *tok = env("AWS_WEB_IDENTITY_TOKEN_FILE");
    if (!role || !tok)
        return 0;
    if (set_str(&c->role_arn, role) || set_str(&c->web_identity_token_file, tok) ||
        set_str(&c->role_session_name, env("AWS_ROLE_SESSION_NAME")))
        return -ENOMEM;
    c->cred_source = AWS_CRED_WEB_IDENTITY;
    return 1;
}

/* The container endpoint (ECS task roles, EKS pod identity), then IMDS. */
static int creds_from_host(struct aws_config *c)
{
    const char *full = env("AWS_CONTAINER_CREDENTIALS_FULL_URI");
    const char *rel = env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI");
    if (full || rel) {
        char url[4096];
        if (full)
            snprintf(url, sizeof url, "%s", full);
        else
            snprintf(url, sizeof url, "http://169.254.170.2%s%s", *rel == '/' ? "" : "/", rel);
        if (set_str(&c->container_url, url) ||
            set_str(&c->container_token, env("AWS_CONTAINER_AUTHORIZATION_TOKEN")) ||
            set_str(&c->container_token_file, env("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE")))
            return -ENOMEM;
        c->cred_source = AWS_CRED_CONTAINER;
        return 1;
    }
    if (is_true(env("AWS_EC2_METADATA_DISABLED")))
        return 0;
    const char *ep = env("AWS_EC2_METADATA_SERVICE_ENDPOINT");
    if (set_str(&c->imds_endpoint, ep ? ep : "http://169.254.169.254"))
        return -ENOMEM;
    c->cred_source = AWS_CRED_IMDS;
    return 1;
}

static int resolve_credentials(struct aws_config *c, const struct shared_files *f,
                               int explicit_profile, int named_profile, char *err, size_t errlen)
{
    int rc = explicit_profile ? 0 : creds_from_env(c);
    if (rc == 0 && !explicit_profile)
        rc = creds_web_identity_env(c);
    if (rc == 0)
        rc = creds_from_profile(c, f, err, errlen);
    if (rc)
        return rc < 0 ? rc : 0;
    const char *mech = unsupported_mechanism(f);
    if (mech) {
        snprintf(err, errlen,
                 "profile '%s' gets credentials via %s, which ckptfs does not support: "
                 "run 'aws configure export-credentials --format env' and export the "
                 "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_SESSION_TOKEN it prints, or use "
                 "credential_process",
                 f->profile, mech);
        return -ENOTSUP;
    }
    if (named_profile && !aws_ini_has_section(&f->cred, f->profile) &&
        !aws_ini_has_section(&f->config, f->config_section)) {
        snprintf(err, errlen, "AWS profile '%s' not found in %s or %s", f->profile, f->cred_path,
                 f->config_path);
        return -ENOENT;
    }
    c->cred_source = AWS_CRED_NONE;
    rc = explicit_profile ? 0 : creds_from_host(c);
    return rc < 0 ? rc : 0;
}

static int resolve_region(struct aws_config *c, const struct aws_config_overrides *ov,
                          const struct shared_files *f)
{
    const char *v;
    if ((v = nonempty(ov->region)))
        c->region_source = "--region";
    else if ((v = env("AWS_REGION")))
        c->region_source = "AWS_REGION";
    else if ((v = env("AWS_DEFAULT_REGION")))
        c->region_source = "AWS_DEFAULT_REGION";
    else if ((v = cfg_get(f, "region")))
        c->region_source = "config file";
    else {
        v = AWS_DEFAULT_REGION_NAME;
        c->region_source = "default";
    }
    return set_str(&c->region, v);
}

/* endpoint_url for s3 in the "services NAME" section the profile points to. */
static const char *services_endpoint(const struct shared_files *f)
{
    const char *svc = cfg_get(f, "services");
    if (!svc)
        return NULL;
    char section[512];
    snprintf(section, sizeof section, "services %s", svc);
    return nonempty(aws_ini_get(&f->config, section, "s3.endpoint_url"));
}

static int is_true(const char *v)
{
    return v && (strcasecmp(v, "true") == 0 || strcmp(v, "1") == 0);
}

static int resolve_endpoint(struct aws_config *c, const struct aws_config_overrides *ov,
                            const struct shared_files *f)
{
    const char *v = NULL;
    int ignore = is_true(env("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS")) ||
                 is_true(cfg_get(f, "ignore_configured_endpoint_urls"));
    if ((v = nonempty(ov->endpoint_url)))
        c->endpoint_source = "--endpoint-url";
    else if (ignore)
        v = NULL;
    else if ((v = env("AWS_ENDPOINT_URL_S3")))
        c->endpoint_source = "AWS_ENDPOINT_URL_S3";
    else if ((v = env("AWS_ENDPOINT_URL")))
        c->endpoint_source = "AWS_ENDPOINT_URL";
    else if ((v = services_endpoint(f)))
        c->endpoint_source = "config file (services)";
    else if ((v = cfg_get(f, "s3.endpoint_url")))
        c->endpoint_source = "config file (s3)";
    else if ((v = cfg_get(f, "endpoint_url")))
        c->endpoint_source = "config file";
    return set_str(&c->endpoint_url, v);
}

static void resolve_addressing(struct aws_config *c, const struct shared_files *f)
{
    const char *v = cfg_get(f, "s3.addressing_style");
    c->addressing = AWS_ADDR_AUTO;
    if (v && strcasecmp(v, "path") == 0)
        c->addressing = AWS_ADDR_PATH;
    else if (v && strcasecmp(v, "virtual") == 0)
        c->addressing = AWS_ADDR_VIRTUAL;
}

int aws_config_resolve(const struct aws_config_overrides *ov, struct aws_config *out, char *err,
                       size_t errlen)
{
    static const struct aws_config_overrides none = {0};
    if (!ov)
        ov = &none;
    memset(out, 0, sizeof *out);
    if (err && errlen)
        err[0] = '\0';
    struct shared_files f = {0};
    int explicit_profile = nonempty(ov->profile) != NULL;
    f.profile = explicit_profile ? ov->profile : env("AWS_PROFILE");
    if (!f.profile)
        f.profile = env("AWS_DEFAULT_PROFILE");
    int named_profile = f.profile != NULL;
    if (!f.profile)
        f.profile = "default";
    int rc = load_shared(&f, err, errlen);
    if (rc == 0)
        rc = set_str(&out->profile, f.profile);
    if (rc == 0)
        rc = resolve_credentials(out, &f, explicit_profile, named_profile, err, errlen);
    if (rc == 0)
        rc = resolve_region(out, ov, &f);
    if (rc == 0)
        rc = resolve_endpoint(out, ov, &f);
    if (rc == 0)
        resolve_addressing(out, &f);
    if (rc == 0 &&
        (out->cred_source == AWS_CRED_WEB_IDENTITY || out->cred_source == AWS_CRED_ASSUME_ROLE)) {
        const char *sts = env("AWS_ENDPOINT_URL_STS");
        if (!sts)
            sts = cfg_get(&f, "sts.endpoint_url");
        rc = set_str(&out->sts_endpoint, sts);
    }
    aws_ini_free(&f.cred);
    aws_ini_free(&f.config);
    if (rc == -ENOMEM && err && errlen)
        snprintf(err, errlen, "out of memory reading AWS configuration");
    if (rc < 0)
        aws_config_free(out);
    return rc;
}

void aws_config_free(struct aws_config *c)
{
    if (!c)
        return;
    free_secret(c->access_key_id);
    free_secret(c->secret_access_key);
    free_secret(c->session_token);
    free(c->region);
    free(c->endpoint_url);
    free(c->profile);
    free(c->role_arn);
    free(c->role_session_name);
    free(c->web_identity_token_file);
    free_secret(c->credential_process);
    free(c->sts_endpoint);
    free(c->container_url);
    free_secret(c->container_token);
    free(c->container_token_file);
    free(c->imds_endpoint);
    memset(c, 0, sizeof *c);
}

const char *aws_cred_source_name(enum aws_cred_source s)
{
    switch (s) {
    case AWS_CRED_ENV:
        return "environment";
    case AWS_CRED_CREDENTIALS_FILE:
        return "shared credentials file";
    case AWS_CRED_CONFIG_FILE:
        return "shared config file";
    case AWS_CRED_WEB_IDENTITY:
        return "web identity (STS AssumeRoleWithWebIdentity)";
    case AWS_CRED_ASSUME_ROLE:
        return "profile role (STS AssumeRole)";
    case AWS_CRED_PROCESS:
        return "credential_process";
    case AWS_CRED_CONTAINER:
        return "container credentials endpoint";
    case AWS_CRED_IMDS:
        return "EC2 instance metadata (IMDSv2)";
    default:
        return "none (anonymous)";
    }
}

char *aws_redact(const char *value, int show_ends, char *buf, size_t len)
{
    if (!buf || !len)
        return buf;
    if (!value || !*value)
        snprintf(buf, len, "(none)");
    else if (show_ends && strlen(value) >= 16)
        snprintf(buf, len, "%.4s...%s", value, value + strlen(value) - 4);
    else
        snprintf(buf, len, "****");
    return buf;
}
