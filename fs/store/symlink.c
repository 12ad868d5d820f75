/*
 * fs/store/symlink.c - symbolic links on a store (issue #18; docs/semantics.md,
 * "Symbolic links"): which objects may be links (a link is an object whose
 * body is its target and whose x-amz-meta-mode has S_IFLNK, s3fs's
 * convention, and a listing does not say which), and where a new link's
 * target lies on the store, so that the link is published after what was
 * staged there. Pure functions: no state, no requests.
 */
#include "store.h"

#include <string.h>
#include <sys/stat.h>

/* Checkpoint file names: never links, so a lookup never pays a HEAD for them. */
static int ends_with(const char *s, size_t n, const char *suffix)
{
    size_t k = strlen(suffix);
    return n >= k && memcmp(s + n - k, suffix, k) == 0;
}

int store_may_be_link(const char *name, uint64_t size)
{
    if (size == 0 || size > STORE_LINK_MAX)
        return 0;
    const char *slash = strrchr(name, '/');
    const char *base = slash ? slash + 1 : name;
    size_t n = strlen(base);
    /* Files a load looks up by the hundred. Not *.pt, *.ckpt, *.bin: a
     * "last.ckpt" or "latest.pt" link is what Lightning and trainers make. */
    static const char *const data[] = {".distcp", ".metadata", ".safetensors",
                                       ".safetensors.index.json"};
    for (size_t i = 0; i < sizeof data / sizeof *data; i++)
        if (ends_with(base, n, data[i]))
            return 0;
    return 1;
}

int store_attrs_is_link(const struct store_attrs *a)
{
    return (a->set & STORE_ATTR_MODE) && S_ISLNK(a->mode);
}

int store_link_wait_path(const char *link, const char *target, char *out, size_t len)
{
    if (len == 0)
        return -1;
    out[0] = '\0';
    if (!*target || *target == '/')
        return 0; /* absolute (or empty): anything staged may be what it names */
    /* Start from the link's directory and apply each component. */
    size_t n = 0;
    const char *slash = strrchr(link, '/');
    if (slash) {
        n = (size_t)(slash - link);
        if (n >= len)
            return -1;
        memcpy(out, link, n);
        out[n] = '\0';
    }
    for (const char *p = target; *p;) {
        const char *e = strchr(p, '/');
        size_t k = e ? (size_t)(e - p) : strlen(p);
        if (k == 0 || (k == 1 && p[0] == '.')) {
            /* "a//b", "./a": nothing */
        } else if (k == 2 && p[0] == '.' && p[1] == '.') {
            if (n == 0) {
                out[0] = '\0'; /* above the mount's root: anything staged */
                return 0;
            }
            char *up = strrchr(out, '/');
            n = up ? (size_t)(up - out) : 0;
            out[n] = '\0';
        } else {
            if (n + (n ? 1 : 0) + k >= len)
                return -1;
            if (n)
                out[n++] = '/';
            memcpy(out + n, p, k);
            n += k;
            out[n] = '\0';
        }
        p += k;
        if (*p == '/')
            p++;
    }
    return 0;
}
