/*
 * fs/store/s3/aws_config.h - resolve S3 credentials, region and endpoint the way the
 * AWS CLI does: explicit options, then AWS_* environment variables, then the
 * shared files (~/.aws/credentials, ~/.aws/config).
 *
 * Precedence (the AWS SDKs' default chain; this file only decides which
 * source applies and collects its settings; creds.c fetches and refreshes):
 *   credentials: --profile given -> that profile only (env, container, IMDS ignored);
 *                else AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN);
 *                else AWS_ROLE_ARN + AWS_WEB_IDENTITY_TOKEN_FILE (web identity);
 *                else the profile (AWS_PROFILE or "default"): role_arn (with
 *                source_profile or web_identity_token_file), static keys (credentials
 *                file, then config file), credential_process; sso is refused;
 *                else AWS_CONTAINER_CREDENTIALS_FULL_URI / _RELATIVE_URI;
 *                else IMDSv2 unless AWS_EC2_METADATA_DISABLED=true; else anonymous.
 *   region:      --region, AWS_REGION, AWS_DEFAULT_REGION, profile region, us-east-1.
 *   endpoint:    --endpoint-url, AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the profile's
 *                services section (s3 = endpoint_url = ...), the profile's nested
 *                s3 endpoint_url, the profile's endpoint_url; else AWS's default.
 * Secrets are never logged; use aws_redact() to mention a key in a log line.
 */
#ifndef CKPTFS_AWS_CONFIG_H
#define CKPTFS_AWS_CONFIG_H

#include <stddef.h>

#define AWS_DEFAULT_REGION_NAME "us-east-1"
#define AWS_INI_MAX_BYTES (1u << 20) /* larger shared files are refused */
#define AWS_INI_MAX_LINE 16384       /* session tokens can be a few KB */
#define AWS_INI_MAX_ENTRIES 10000

enum aws_cred_source {
    AWS_CRED_NONE = 0,         /* anonymous */
    AWS_CRED_ENV,              /* AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY */
    AWS_CRED_CREDENTIALS_FILE, /* shared credentials file */
    AWS_CRED_CONFIG_FILE,      /* shared config file */
    AWS_CRED_WEB_IDENTITY,     /* STS AssumeRoleWithWebIdentity (env or profile) */
    AWS_CRED_ASSUME_ROLE,      /* profile role_arn + source_profile: STS AssumeRole */
    AWS_CRED_PROCESS,          /* profile credential_process */
    AWS_CRED_CONTAINER,        /* container credentials endpoint (ECS, EKS pod identity) */
    AWS_CRED_IMDS,             /* EC2 instance metadata (IMDSv2) */
};

enum aws_addressing {
    AWS_ADDR_AUTO = 0,
    AWS_ADDR_PATH,
    AWS_ADDR_VIRTUAL,
};

/* Explicit settings (command-line options); NULL or "" = not given. */
struct aws_config_overrides {
    const char *endpoint_url;
    const char *region;
    const char *profile;
};

struct aws_config {
    char *access_key_id;     /* NULL when anonymous */
    char *secret_access_key; /* NULL when anonymous */
    char *session_token;     /* NULL if none */
    char *region;            /* never NULL after a successful resolve */
    char *endpoint_url;      /* NULL = AWS default endpoint for the region */
    char *profile;           /* the profile consulted in the files */
    enum aws_cred_source cred_source;
    enum aws_addressing addressing; /* s3.addressing_style in the config file */
    const char *region_source;      /* "--region", "AWS_REGION", ..., "default" */
    const char *endpoint_source;    /* "--endpoint-url", "AWS_ENDPOINT_URL", ..., NULL */
    /* Settings of the fetched sources (NULL when not used). For ASSUME_ROLE the
     * access_key_id/secret_access_key/session_token above are the source
     * profile's keys, which sign the AssumeRole call. */
    char *role_arn;                /* WEB_IDENTITY, ASSUME_ROLE */
    char *role_session_name;       /* or NULL: creds.c makes one up */
    char *web_identity_token_file; /* WEB_IDENTITY */
    char *credential_process;      /* PROCESS: a shell command line */
    char *sts_endpoint;            /* AWS_ENDPOINT_URL_STS or the profile's sts endpoint */
    char *container_url;           /* CONTAINER: full URL */
    char *container_token;         /* AWS_CONTAINER_AUTHORIZATION_TOKEN */
    char *container_token_file;    /* AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE (wins) */
    char *imds_endpoint;           /* IMDS: AWS_EC2_METADATA_SERVICE_ENDPOINT or default */
};

/* Resolve into *out (free with aws_config_free). 0, or a negative errno with
 * a one-line reason in err: -ENOENT for a named profile found in neither file
 * (or a missing source_profile), -ENOTSUP for a profile whose credentials need
 * a mechanism ckptfs lacks (sso, credential_source), -EINVAL for an unreadable
 * shared file. Nothing is fetched here. */
int aws_config_resolve(const struct aws_config_overrides *ov, struct aws_config *out, char *err,
                       size_t errlen);
void aws_config_free(struct aws_config *c);

const char *aws_cred_source_name(enum aws_cred_source s);

/* A loggable stand-in for a credential: with show_ends (access key ids only)
 * "AKIA...MPLE" for long values, otherwise "****"; "(none)" for NULL/"".
 * Never pass secret keys or tokens with show_ends set. Returns buf. */
char *aws_redact(const char *value, int show_ends, char *buf, size_t len);

/* ---- the INI reader (exposed for tests) --------------------------------- */

struct aws_ini_entry {
    char *section; /* "default", "profile dev", "services s3local" */
    char *key;     /* lower-cased; nested keys as "s3.endpoint_url" */
    char *value;
};

struct aws_ini {
    struct aws_ini_entry *entries;
    size_t n, cap;
};

/* Parse text (bounded by the limits above). 0 or -EFBIG / -ENOMEM. Lines that
 * are neither sections, "key = value" nor comments are ignored. */
int aws_ini_parse(const char *text, size_t len, struct aws_ini *ini);
/* Load and parse a file; a missing file yields an empty ini and 0. */
int aws_ini_load(const char *path, struct aws_ini *ini);
/* The last value of key in section, or NULL. */
const char *aws_ini_get(const struct aws_ini *ini, const char *section, const char *key);
/* 1 if the section appears at all. */
int aws_ini_has_section(const struct aws_ini *ini, const char *section);
void aws_ini_free(struct aws_ini *ini);

#endif
