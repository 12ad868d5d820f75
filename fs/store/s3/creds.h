/*
 * fs/store/s3/creds.h - the credentials S3 requests are signed with: fetching them
 * from the source aws_config.c picked (static keys, STS web identity, STS
 * AssumeRole, credential_process, container endpoint, IMDSv2), and refreshing
 * temporary ones ahead of their expiry for the life of the mount.
 *
 * Credentials are immutable, refcounted objects. The provider holds the
 * current one; creds_provider_get() hands out a reference that the caller
 * keeps for as long as it signs with it (a request in flight keeps its
 * credentials even when the provider has swapped in newer ones). The first
 * creds_provider_get() after creds_refresh_at() starts one refresh thread
 * (never two at a time) and goes on with the current credentials; the thread
 * swaps the new ones in, or schedules a retry with backoff while the old
 * ones stay in use until they expire. Threads start only on demand, so a
 * provider created before fuse_daemonize() forks keeps working after it.
 * Secrets are never logged.
 *
 * The parsers (JSON of credential_process / IMDS / container endpoints, XML
 * of STS) are pure, bounded (CREDS_MAX_RESPONSE) and exposed for tests.
 */
#ifndef CKPTFS_CREDS_H
#define CKPTFS_CREDS_H

#include <stdatomic.h>
#include <stddef.h>
#include <time.h>

#include "aws_config.h"

#define CREDS_MAX_RESPONSE (64 * 1024) /* bigger answers from any source are refused */
#define CREDS_REFRESH_AHEAD_S 300      /* refresh 5 min before expiry ... */
#define CREDS_RETRY_MIN_S 1            /* ... failed refreshes retried after 1, 2, 4 ... */
#define CREDS_RETRY_MAX_S 60           /* ... up to 60 s */
#define CREDS_PROCESS_TIMEOUT_S 60     /* a credential_process running longer is killed */
#define CREDS_HTTP_CONNECT_MS 1000     /* IMDS / container / STS connect timeout */
#define CREDS_HTTP_TIMEOUT_MS 5000     /* whole request, STS and container */
#define CREDS_IMDS_TIMEOUT_MS 2000     /* whole request, IMDS (absent IMDS fails fast) */
#define CREDS_EXPIRED_WAIT_S 10        /* a get() of expired credentials waits for new ones */

/* One set of credentials; never changed after it is published. */
struct creds {
    atomic_int refs;
    char *access_key_id;
    char *secret_access_key;
    char *session_token; /* NULL if none */
    time_t expiration;   /* wall clock; 0 = does not expire */
};

/* A new object with one reference, copies of the strings (token may be
 * NULL); NULL when out of memory. */
struct creds *creds_new(const char *id, const char *secret, const char *token, time_t expiration);
/* Take one more reference; returns c. */
struct creds *creds_ref(struct creds *c);
/* Drop a reference; the last one wipes the secrets and frees. NULL is ok. */
void creds_unref(struct creds *c);

/* What a response is, for the JSON parser. */
enum creds_json_kind {
    CREDS_JSON_PROCESS,   /* credential_process: Version 1, SessionToken */
    CREDS_JSON_IMDS,      /* IMDS: Code "Success", Token */
    CREDS_JSON_CONTAINER, /* container endpoint: Token */
};

/* Parse a JSON credentials document into *out (one reference). 0, or -EINVAL
 * / -EFBIG / -ENOMEM with a one-line reason (never a secret) in err. A
 * missing Expiration means credentials that do not expire. */
int creds_parse_json(const char *body, size_t len, enum creds_json_kind kind, struct creds **out,
                     char *err, size_t errlen);

/* Parse an STS AssumeRole / AssumeRoleWithWebIdentity answer (or its
 * <ErrorResponse>, whose Code and Message go to err) into *out. 0 or -EINVAL
 * / -EACCES (an STS error document) / -EFBIG / -ENOMEM. */
int creds_parse_sts_xml(const char *body, size_t len, struct creds **out, char *err, size_t errlen);

/* ISO 8601 UTC time ("2026-12-01T06:00:00Z", fractions and +HH:MM offsets
 * accepted) into *t. 0 or -EINVAL. */
int creds_parse_time(const char *s, time_t *t);

/* When to refresh credentials fetched at `fetched` that expire at
 * `expires`: CREDS_REFRESH_AHEAD_S before, or half-way through a shorter
 * lifetime; never earlier than fetched + 1. */
time_t creds_refresh_at(time_t fetched, time_t expires);

/* Seconds to wait after the failures-th failed refresh in a row (>= 1) at
 * now: 1, 2, 4, ... capped at CREDS_RETRY_MAX_S and, while the current
 * credentials are valid, at half the time they have left (at least 1). */
long creds_retry_delay(int failures, time_t now, time_t expires);

struct creds_provider;

/* A provider for cfg's source: fetches the first credentials now (so a
 * broken source fails the mount with a one-line reason in err); no thread
 * is started here. 0 and *out, or a negative errno. *out is
 * NULL (anonymous) for AWS_CRED_NONE and when IMDS does not answer at all.
 * The log line says which source was used, never a secret. */
int creds_provider_create(const struct aws_config *cfg, struct creds_provider **out, char *err,
                          size_t errlen);
/* Wait for a refresh under way, drop the current credentials. NULL is ok. */
void creds_provider_destroy(struct creds_provider *p);

/* The current credentials (a reference: creds_unref it), or NULL for an
 * anonymous (NULL) provider. Starts a refresh if one is due; if the current
 * credentials have expired, waits for it (CREDS_EXPIRED_WAIT_S at most). */
struct creds *creds_provider_get(struct creds_provider *p);

/* Refreshes that succeeded / failed so far (for stats and tests). */
unsigned long creds_provider_refreshes(const struct creds_provider *p);

#endif
