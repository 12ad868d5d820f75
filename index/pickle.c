/*
 * index/pickle.c - bounded, non-executing pickle reader (see pickle.h).
 *
 * One pass over the input with an explicit value stack, a mark stack (stack
 * heights) and a memo array. Every argument length is checked against the
 * bytes left before anything is allocated, so a declared 4 GiB string in a
 * 20-byte file costs nothing. All values live in the document's arena.
 */
#include "pickle.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strmap.h"

/* ---- opcodes ---------------------------------------------------------- */

enum {
    OP_MARK = '(',
    OP_STOP = '.',
    OP_POP = '0',
    OP_POP_MARK = '1',
    OP_DUP = '2',
    OP_FLOAT = 'F',
    OP_INT = 'I',
    OP_BININT = 'J',
    OP_BININT1 = 'K',
    OP_LONG = 'L',
    OP_BININT2 = 'M',
    OP_NONE = 'N',
    OP_PERSID = 'P',
    OP_BINPERSID = 'Q',
    OP_REDUCE = 'R',
    OP_STRING = 'S',
    OP_BINSTRING = 'T',
    OP_SHORT_BINSTRING = 'U',
    OP_UNICODE = 'V',
    OP_BINUNICODE = 'X',
    OP_APPEND = 'a',
    OP_BUILD = 'b',
    OP_GLOBAL = 'c',
    OP_DICT = 'd',
    OP_EMPTY_DICT = '}',
    OP_APPENDS = 'e',
    OP_GET = 'g',
    OP_BINGET = 'h',
    OP_INST = 'i',
    OP_LONG_BINGET = 'j',
    OP_LIST = 'l',
    OP_EMPTY_LIST = ']',
    OP_OBJ = 'o',
    OP_PUT = 'p',
    OP_BINPUT = 'q',
    OP_LONG_BINPUT = 'r',
    OP_SETITEM = 's',
    OP_TUPLE = 't',
    OP_EMPTY_TUPLE = ')',
    OP_SETITEMS = 'u',
    OP_BINFLOAT = 'G',
    OP_BINBYTES = 'B',
    OP_SHORT_BINBYTES = 'C',
    OP_PROTO = 0x80,
    OP_NEWOBJ = 0x81,
    OP_EXT1 = 0x82,
    OP_EXT2 = 0x83,
    OP_EXT4 = 0x84,
    OP_TUPLE1 = 0x85,
    OP_TUPLE2 = 0x86,
    OP_TUPLE3 = 0x87,
    OP_NEWTRUE = 0x88,
    OP_NEWFALSE = 0x89,
    OP_LONG1 = 0x8a,
    OP_LONG4 = 0x8b,
    OP_SHORT_BINUNICODE = 0x8c,
    OP_BINUNICODE8 = 0x8d,
    OP_BINBYTES8 = 0x8e,
    OP_EMPTY_SET = 0x8f,
    OP_ADDITEMS = 0x90,
    OP_FROZENSET = 0x91,
    OP_NEWOBJ_EX = 0x92,
    OP_STACK_GLOBAL = 0x93,
    OP_MEMOIZE = 0x94,
    OP_FRAME = 0x95,
    OP_BYTEARRAY8 = 0x96,
    OP_NEXT_BUFFER = 0x97,
    OP_READONLY_BUFFER = 0x98,
};

const char *pkl_opcode_name(unsigned op)
{
    switch (op) {
#define N(x)                                                                                       \
    case OP_##x:                                                                                   \
        return #x;
        N(MARK)
        N(STOP)
        N(POP)
        N(POP_MARK)
        N(DUP)
        N(FLOAT)
        N(INT)
        N(BININT)
        N(BININT1)
        N(LONG)
        N(BININT2)
        N(NONE)
        N(PERSID)
        N(BINPERSID)
        N(REDUCE)
        N(STRING)
        N(BINSTRING)
        N(SHORT_BINSTRING)
        N(UNICODE)
        N(BINUNICODE)
        N(APPEND)
        N(BUILD)
        N(GLOBAL)
        N(DICT)
        N(EMPTY_DICT)
        N(APPENDS)
        N(GET)
        N(BINGET)
        N(INST)
        N(LONG_BINGET)
        N(LIST)
        N(EMPTY_LIST)
        N(OBJ)
        N(PUT)
        N(BINPUT)
        N(LONG_BINPUT)
        N(SETITEM)
        N(TUPLE)
        N(EMPTY_TUPLE)
        N(SETITEMS)
        N(BINFLOAT)
        N(BINBYTES)
        N(SHORT_BINBYTES)
        N(PROTO)
        N(NEWOBJ)
        N(EXT1)
        N(EXT2)
        N(EXT4)
        N(TUPLE1)
        N(TUPLE2)
        N(TUPLE3)
        N(NEWTRUE)
        N(NEWFALSE)
        N(LONG1)
        N(LONG4)
        N(SHORT_BINUNICODE)
        N(BINUNICODE8)
        N(BINBYTES8)
        N(EMPTY_SET)
        N(ADDITEMS)
        N(FROZENSET)
        N(NEWOBJ_EX)
        N(STACK_GLOBAL)
        N(MEMOIZE)
        N(FRAME)
        N(BYTEARRAY8)
        N(NEXT_BUFFER)
        N(READONLY_BUFFER)
#undef N
    default:
        return NULL;
    }
}

const char *pkl_type_name(int type)
{
    static const char *const names[] = {"?",         "None",   "bool",   "int",   "int",  "float",
                                        "str",       "bytes",  "tuple",  "list",  "dict", "set",
                                        "frozenset", "global", "object", "folded"};
    if (type < 0 || (size_t)type >= sizeof(names) / sizeof(names[0]))
        return "?";
    return names[type];
}

void pkl_options_default(struct pkl_options *o)
{
    memset(o, 0, sizeof(*o));
    o->lim.max_input = (size_t)1 << 30;
    o->lim.max_memory = (size_t)4 << 30;
    o->lim.max_stack = 65536;
    o->lim.max_marks = 1024;
    o->lim.max_memo = (size_t)256 << 20; /* 1,024-rank .metadata: ~20M; charged to max_memory */
    o->lim.max_container = (size_t)64 << 20;
    o->lim.max_long_bytes = 1024;
    o->lim.max_global_len = 1024;
    o->lim.max_globals = 4096;
    o->lim.min_protocol = 2;
    o->lim.allow_trailing = 1;
}

/* ---- parser state ----------------------------------------------------- */

struct parser {
    const uint8_t *in;
    size_t len;
    size_t pos;   /* next byte to read */
    size_t oppos; /* position of the current opcode */
    unsigned op;
    const struct pkl_limits *lim;
    const struct pkl_options *opt;
    struct pkl_doc *doc;
    struct ckpt_err *err;
    int rc;

    struct pkl_value **stack;
    size_t sp, scap;
    size_t *marks;
    size_t nmarks, mcap;
    struct pkl_value **memo;
    size_t memo_len; /* highest index + 1 */
    size_t memo_count;
    size_t memo_cap;
    struct strmap globals; /* "module\nname" -> index in doc globals */
    size_t globals_cap;

    /* fold mode (opt->fold and a successful prescan): the memo keeps values
     * only for the slots some BINGET reads; memo/memo_cap are unused */
    int fold;
    uint64_t *ref;             /* bit i: memo slot i is read by a BINGET/LONG_BINGET */
    uint32_t *ref_rank;        /* referenced slots in the words before word w */
    size_t ref_words;          /* words of ref */
    struct pkl_value **refval; /* values of referenced slots, by rank */
    uint64_t *set;             /* bit i: memo slot i was stored */
    size_t set_words;

    struct pkl_value *none, *vtrue, *vfalse;
};

#ifndef NDEBUG
/* The machine's invariants between two opcodes: the stack, the marks and the memo within
 * their arrays and their limits, the top mark at or below the stack top (marks only grow
 * upwards, see OP_MARK), and the input read no further than its end. Checked by assert. */
static int machine_consistent(const struct parser *P)
{
    const struct pkl_limits *L = P->lim;
    if (P->pos > P->len || P->sp > P->scap || P->sp > L->max_stack)
        return 0;
    if (P->nmarks > P->mcap || P->nmarks > L->max_marks)
        return 0;
    if (P->nmarks && P->marks[P->nmarks - 1] > P->sp)
        return 0;
    if (P->memo_len > L->max_memo || P->memo_count > P->memo_len)
        return 0;
    if (P->fold)
        return P->memo_len <= P->set_words * 64;
    return P->memo_len <= P->memo_cap;
}
#endif

static int fail(struct parser *P, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(struct parser *P, int code, const char *fmt, ...)
{
    char detail[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof(detail), fmt, ap);
    va_end(ap);
    const char *name = pkl_opcode_name(P->op);
    if (P->err && !P->err->code) {
        if (name)
            ckpt_err_set(P->err, code, P->oppos, "pickle: byte %zu, opcode %s (0x%02x): %s",
                         P->oppos, name, P->op, detail);
        else
            ckpt_err_set(P->err, code, P->oppos, "pickle: byte %zu, opcode 0x%02x: %s", P->oppos,
                         P->op, detail);
    }
    P->rc = code;
    return code;
}

static int oom(struct parser *P)
{
    if (P->lim->max_memory && P->doc->arena.used + (1u << 20) >= P->lim->max_memory)
        return fail(P, CKPT_ELIMIT, "memory limit of %zu bytes reached", P->lim->max_memory);
    return fail(P, -ENOMEM, "out of memory");
}

static struct pkl_value *newval(struct parser *P, int type)
{
    struct pkl_value *v = arena_alloc(&P->doc->arena, sizeof(*v));
    if (!v) {
        oom(P);
        return NULL;
    }
    memset(v, 0, sizeof(*v));
    v->type = (uint8_t)type;
    v->pos = P->oppos;
    P->doc->nvalues++;
    return v;
}

static int need(struct parser *P, uint64_t n, const char *what)
{
    size_t left = P->len - P->pos;
    if (n > left)
        return fail(P, CKPT_ETRUNC, "%s needs %" PRIu64 " bytes but only %zu remain", what, n,
                    left);
    return 0;
}

static uint64_t rd_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static int push(struct parser *P, struct pkl_value *v)
{
    if (!v)
        return P->rc ? P->rc : oom(P);
    if (P->sp >= P->lim->max_stack)
        return fail(P, CKPT_ELIMIT, "stack limit of %zu values reached", P->lim->max_stack);
    if (P->sp == P->scap) {
        size_t ncap = P->scap ? P->scap * 2 : 64;
        if (ncap > P->lim->max_stack)
            ncap = P->lim->max_stack;
        struct pkl_value **s = realloc(P->stack, ncap * sizeof(*s));
        if (!s)
            return oom(P);
        P->stack = s;
        P->scap = ncap;
    }
    assert(P->sp < P->scap);
    P->stack[P->sp++] = v;
    return 0;
}

static size_t base(const struct parser *P)
{
    return P->nmarks ? P->marks[P->nmarks - 1] : 0;
}

/* At least n values above the current mark? */
static int have(struct parser *P, size_t n)
{
    size_t avail = P->sp - base(P);
    if (avail < n) {
        if (avail == 0 && P->sp == 0)
            return fail(P, CKPT_ESTACK, "stack underflow: needs %zu value(s), stack is empty", n);
        return fail(P, CKPT_ESTACK,
                    "stack underflow: needs %zu value(s), %zu available above the current MARK", n,
                    avail);
    }
    return 0;
}

static int pop_mark(struct parser *P, size_t *k)
{
    if (!P->nmarks)
        return fail(P, CKPT_ESTACK, "no MARK on the stack");
    *k = P->marks[--P->nmarks];
    assert(*k <= P->sp);
    return 0;
}

static int seq_reserve(struct parser *P, struct pkl_value *v, size_t extra)
{
    size_t len = v->u.seq.len;
    if (extra > P->lim->max_container || len > P->lim->max_container - extra)
        return fail(P, CKPT_ELIMIT, "container limit of %zu items reached", P->lim->max_container);
    if (len + extra <= v->u.seq.cap)
        return 0;
    size_t ncap = v->u.seq.cap ? v->u.seq.cap : 4;
    while (ncap < len + extra)
        ncap *= 2;
    struct pkl_value **items = arena_alloc(&P->doc->arena, ncap * sizeof(*items));
    if (!items)
        return oom(P);
    if (len)
        memcpy(items, v->u.seq.items, len * sizeof(*items));
    v->u.seq.items = items;
    v->u.seq.cap = ncap;
    return 0;
}

static int seq_append(struct parser *P, struct pkl_value *v, struct pkl_value *const *src, size_t n)
{
    if (!n)
        return 0;
    int rc = seq_reserve(P, v, n);
    if (rc)
        return rc;
    memcpy(v->u.seq.items + v->u.seq.len, src, n * sizeof(*src));
    v->u.seq.len += n;
    return 0;
}

static int hashable(struct parser *P, const struct pkl_value *k)
{
    int t = k->type;
    if (t == PKL_LIST || t == PKL_DICT || t == PKL_SET ||
        (t == PKL_BYTES && (k->flags & PKL_F_BYTEARRAY)))
        return fail(P, CKPT_ETYPE, "unhashable %s (created at byte %" PRIu64 ") used as a key",
                    pkl_type_name(t), k->pos);
    if (t == PKL_TUPLE && (k->flags & PKL_F_UNHASHABLE)) {
        /* flagged when the tuple was built: rescanning its items for every
         * use as a key would make one shared big tuple quadratic */
        int ti = PKL_LIST;
        for (size_t i = 0; i < k->u.seq.len; i++) {
            ti = k->u.seq.items[i]->type;
            if (ti == PKL_LIST || ti == PKL_DICT || ti == PKL_SET)
                break;
        }
        return fail(P, CKPT_ETYPE, "tuple key holds an unhashable %s", pkl_type_name(ti));
    }
    return 0;
}

/* Tuples never change after they are built: note once whether one holds
 * an unhashable item, so hashable() is O(1) however often it is a key. */
static void tuple_seal(struct pkl_value *v)
{
    for (size_t i = 0; i < v->u.seq.len; i++) {
        int ti = v->u.seq.items[i]->type;
        if (ti == PKL_LIST || ti == PKL_DICT || ti == PKL_SET) {
            v->flags |= PKL_F_UNHASHABLE;
            return;
        }
    }
}

/* Add pairs src[0..2n) to a dict, or to an object's dictitems. */
static int dict_add(struct parser *P, struct pkl_value *target, struct pkl_value *const *src,
                    size_t n2)
{
    for (size_t i = 0; i < n2; i += 2) {
        int rc = hashable(P, src[i]);
        if (rc)
            return rc;
    }
    if (target->type == PKL_OBJECT) {
        if (!target->u.obj->dictitems) {
            target->u.obj->dictitems = newval(P, PKL_DICT);
            if (!target->u.obj->dictitems)
                return P->rc;
        }
        target = target->u.obj->dictitems;
    } else if (target->type != PKL_DICT) {
        return fail(P, CKPT_ETYPE, "cannot set items on a %s (created at byte %" PRIu64 ")",
                    pkl_type_name(target->type), target->pos);
    }
    return seq_append(P, target, src, n2);
}

static int list_add(struct parser *P, struct pkl_value *target, struct pkl_value *const *src,
                    size_t n)
{
    if (target->type == PKL_OBJECT) {
        if (!target->u.obj->listitems) {
            target->u.obj->listitems = newval(P, PKL_LIST);
            if (!target->u.obj->listitems)
                return P->rc;
        }
        target = target->u.obj->listitems;
    } else if (target->type != PKL_LIST) {
        return fail(P, CKPT_ETYPE, "cannot append to a %s (created at byte %" PRIu64 ")",
                    pkl_type_name(target->type), target->pos);
    }
    return seq_append(P, target, src, n);
}

/* ---- strings ---------------------------------------------------------- */

/* UTF-8 check, accepting encoded surrogates like CPython's surrogatepass.
 * Returns the offset of the first bad byte, or SIZE_MAX if valid. */
static size_t utf8_bad(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t k;
        uint32_t cp;
        if (c >= 0xc2 && c <= 0xdf) {
            k = 1;
            cp = c & 0x1f;
        } else if (c >= 0xe0 && c <= 0xef) {
            k = 2;
            cp = c & 0x0f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            k = 3;
            cp = c & 0x07;
        } else {
            return i;
        }
        if (n - i <= k)
            return i;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xc0) != 0x80)
                return i;
            cp = (cp << 6) | (s[i + j] & 0x3f);
        }
        if ((k == 2 && cp < 0x800) || (k == 3 && (cp < 0x10000 || cp > 0x10ffff)))
            return i; /* overlong or out of range */
        i += k + 1;
    }
    return SIZE_MAX;
}

static int push_str(struct parser *P, uint64_t n, int type, int flags)
{
    int rc = need(P, n, type == PKL_STR ? "string" : "bytes");
    if (rc)
        return rc;
    const uint8_t *s = P->in + P->pos;
    if (type == PKL_STR) {
        size_t bad = utf8_bad(s, (size_t)n);
        if (bad != SIZE_MAX)
            return fail(P, CKPT_EENCODING, "invalid UTF-8 at byte %zu of the string", P->pos + bad);
    }
    struct pkl_value *v = newval(P, type);
    if (!v)
        return P->rc;
    char *copy = arena_strndup(&P->doc->arena, (const char *)s, (size_t)n);
    if (!copy)
        return oom(P);
    v->flags = (uint8_t)flags;
    v->u.str.s = copy;
    v->u.str.len = (size_t)n;
    P->pos += (size_t)n;
    return push(P, v);
}

/* LONG1 / LONG4 payload: little-endian two's complement. */
/* The first min(n, 8) bytes of a LONG1/LONG4 integer at b as an int64:
 * little-endian two's complement, sign-extended from byte n-1. */
static int64_t rd_long(const uint8_t *b, uint64_t n)
{
    uint64_t u = n && (b[n - 1] & 0x80) ? UINT64_MAX : 0;
    for (uint64_t i = 0; i < n && i < 8; i++) {
        u &= ~((uint64_t)0xff << (8 * i));
        u |= (uint64_t)b[i] << (8 * i);
    }
    return (int64_t)u;
}

static int push_long(struct parser *P, uint64_t n)
{
    if (n > P->lim->max_long_bytes) {
        int rc = need(P, n, "long integer");
        if (rc)
            return rc;
        return fail(P, CKPT_ELIMIT, "integer of %" PRIu64 " bytes exceeds the limit of %zu", n,
                    P->lim->max_long_bytes);
    }
    int rc = need(P, n, "long integer");
    if (rc)
        return rc;
    const uint8_t *b = P->in + P->pos;
    int neg = n && (b[n - 1] & 0x80);
    /* fits int64 if every byte beyond the 8th is sign extension */
    int fits = 1;
    for (uint64_t i = 8; i < n; i++)
        if (b[i] != (neg ? 0xff : 0x00))
            fits = 0;
    if (n > 8 && fits && ((b[7] & 0x80) != 0) != neg)
        fits = 0;
    struct pkl_value *v;
    if (fits) {
        v = newval(P, PKL_INT);
        if (!v)
            return P->rc;
        v->u.i = rd_long(b, n);
    } else {
        v = newval(P, PKL_BIGINT);
        if (!v)
            return P->rc;
        char *copy = arena_strndup(&P->doc->arena, (const char *)b, (size_t)n);
        if (!copy)
            return oom(P);
        v->u.str.s = copy;
        v->u.str.len = (size_t)n;
    }
    P->pos += (size_t)n;
    return push(P, v);
}

/* ---- globals ---------------------------------------------------------- */

static int check_name(struct parser *P, const char *s, size_t n, const char *what)
{
    if (n == 0)
        return fail(P, CKPT_EFORMAT, "empty %s name in a class reference", what);
    if (n > P->lim->max_global_len)
        return fail(P, CKPT_ELIMIT, "%s name of %zu bytes exceeds the limit of %zu", what, n,
                    P->lim->max_global_len);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return fail(P, CKPT_EFORMAT, "control character in %s name", what);
    if (utf8_bad((const uint8_t *)s, n) != SIZE_MAX)
        return fail(P, CKPT_EENCODING, "invalid UTF-8 in %s name", what);
    return 0;
}

static int push_global(struct parser *P, const char *mod, size_t mlen, const char *name,
                       size_t nlen)
{
    int rc = check_name(P, mod, mlen, "module");
    if (!rc)
        rc = check_name(P, name, nlen, "class");
    if (rc)
        return rc;
    char key[2 * 1024 + 2];
    char *kp = key;
    char *heap = NULL;
    if (mlen + nlen + 1 > sizeof(key)) {
        heap = malloc(mlen + nlen + 1);
        if (!heap)
            return oom(P);
        kp = heap;
    }
    memcpy(kp, mod, mlen);
    kp[mlen] = '\n';
    memcpy(kp + mlen + 1, name, nlen);
    size_t klen = mlen + nlen + 1;
    uint32_t idx;
    struct pkl_doc *d = P->doc;
    if (strmap_get(&P->globals, kp, klen, &idx) != 0) {
        if (d->nglobals >= P->lim->max_globals) {
            free(heap);
            return fail(P, CKPT_ELIMIT, "more than %zu distinct class references",
                        P->lim->max_globals);
        }
        char *m = arena_strndup(&d->arena, mod, mlen);
        char *n = arena_strndup(&d->arena, name, nlen);
        char *k = arena_strndup(&d->arena, kp, klen);
        free(heap);
        if (!m || !n || !k)
            return oom(P);
        if (P->opt->filter && !P->opt->filter(P->opt->filter_arg, m, n))
            return fail(P, CKPT_EGLOBAL, "class reference %s.%s is not on the allow-list", m, n);
        if (d->nglobals == P->globals_cap) {
            size_t ncap = P->globals_cap ? P->globals_cap * 2 : 32;
            const char **gm = realloc(d->global_module, ncap * sizeof(*gm));
            if (!gm)
                return oom(P);
            d->global_module = gm;
            const char **gn = realloc(d->global_name, ncap * sizeof(*gn));
            if (!gn)
                return oom(P);
            d->global_name = gn;
            P->globals_cap = ncap;
        }
        idx = (uint32_t)d->nglobals;
        if (strmap_put(&P->globals, k, klen, idx, NULL) < 0)
            return oom(P);
        d->global_module[idx] = m;
        d->global_name[idx] = n;
        d->nglobals++;
    } else {
        free(heap);
    }
    struct pkl_value *v = newval(P, PKL_GLOBAL);
    if (!v)
        return P->rc;
    v->u.global.module = d->global_module[idx];
    v->u.global.name = d->global_name[idx];
    return push(P, v);
}

/* GLOBAL's text argument: "module\nname\n". */
static int read_line(struct parser *P, const char **s, size_t *n)
{
    size_t left = P->len - P->pos;
    size_t max = P->lim->max_global_len + 1;
    const uint8_t *start = P->in + P->pos;
    const uint8_t *nl = memchr(start, '\n', left < max ? left : max);
    if (!nl) {
        if (left < max)
            return fail(P, CKPT_ETRUNC, "GLOBAL argument is not terminated by a newline");
        return fail(P, CKPT_ELIMIT, "GLOBAL argument longer than %zu bytes",
                    P->lim->max_global_len);
    }
    *s = (const char *)start;
    *n = (size_t)(nl - start);
    P->pos += *n + 1;
    return 0;
}

/* ---- memo ------------------------------------------------------------- */

/* Fold mode's memo: a bitmap of stored slots, and values for the slots the
 * prescan saw read (ref), so a 20M-slot memo costs bits, not pointers. */
/* Bits set in x (no popcnt instruction assumed). */
static unsigned popcount64(uint64_t x)
{
    x = x - ((x >> 1) & 0x5555555555555555ull);
    x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
    x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0full;
    return (unsigned)((x * 0x0101010101010101ull) >> 56);
}

static int ref_has(const struct parser *P, uint64_t idx)
{
    return idx >> 6 < P->ref_words && (P->ref[idx >> 6] >> (idx & 63) & 1);
}

static size_t ref_slot(const struct parser *P, uint64_t idx)
{
    assert(ref_has(P, idx));
    uint64_t below = P->ref[idx >> 6] & (((uint64_t)1 << (idx & 63)) - 1);
    return P->ref_rank[idx >> 6] + (size_t)popcount64(below);
}

static int set_has(const struct parser *P, uint64_t idx)
{
    return idx >> 6 < P->set_words && (P->set[idx >> 6] >> (idx & 63) & 1);
}

/* Mark slot idx stored; 1 if it was not before, 0 if it was, or -ENOMEM. */
static int set_add(struct parser *P, uint64_t idx)
{
    size_t w = (size_t)(idx >> 6);
    if (w >= P->set_words) {
        size_t n = P->set_words ? P->set_words : 64;
        while (n <= w)
            n *= 2;
        uint64_t *s = realloc(P->set, n * sizeof(*s));
        if (!s)
            return -ENOMEM;
        memset(s + P->set_words, 0, (n - P->set_words) * sizeof(*s));
        P->set = s;
        P->set_words = n;
    }
    uint64_t bit = (uint64_t)1 << (idx & 63);
    if (P->set[w] & bit)
        return 0;
    P->set[w] |= bit;
    return 1;
}

static int memo_put(struct parser *P, uint64_t idx)
{
    int rc = have(P, 1);
    if (rc)
        return rc;
    if (idx >= P->lim->max_memo)
        return fail(P, CKPT_ELIMIT, "memo index %" PRIu64 " exceeds the limit of %zu", idx,
                    P->lim->max_memo);
    if (idx > (uint64_t)P->memo_len + 65536)
        return fail(P, CKPT_EMEMO, "memo index %" PRIu64 " is far beyond the %zu used so far", idx,
                    P->memo_len);
    if (P->fold) {
        int added = set_add(P, idx);
        if (added < 0)
            return oom(P);
        assert(set_has(P, idx));
        P->memo_count += (size_t)added;
        if (ref_has(P, idx))
            P->refval[ref_slot(P, idx)] = P->stack[P->sp - 1];
        if (idx >= P->memo_len)
            P->memo_len = (size_t)idx + 1;
        return 0;
    }
    if (idx >= P->memo_cap) {
        size_t ncap = P->memo_cap ? P->memo_cap : 64;
        while (ncap <= idx)
            ncap *= 2;
        if (P->lim->max_memory &&
            ncap * sizeof(struct pkl_value *) + P->doc->arena.used >= P->lim->max_memory)
            return fail(P, CKPT_ELIMIT, "memory limit of %zu bytes reached (memo of %zu)",
                        P->lim->max_memory, ncap);
        struct pkl_value **m = realloc(P->memo, ncap * sizeof(*m));
        if (!m)
            return oom(P);
        memset(m + P->memo_cap, 0, (ncap - P->memo_cap) * sizeof(*m));
        P->memo = m;
        P->memo_cap = ncap;
    }
    assert(idx < P->memo_cap);
    if (!P->memo[idx])
        P->memo_count++;
    P->memo[idx] = P->stack[P->sp - 1];
    if (idx >= P->memo_len)
        P->memo_len = (size_t)idx + 1;
    return 0;
}

/* The value in memo slot idx, or NULL if it was never stored. */
static struct pkl_value *memo_at(const struct parser *P, uint64_t idx)
{
    if (idx >= P->memo_len)
        return NULL;
    if (!P->fold)
        return P->memo[idx];
    /* a slot stored but not seen read by the prescan cannot be read */
    return set_has(P, idx) && ref_has(P, idx) ? P->refval[ref_slot(P, idx)] : NULL;
}

static int memo_get(struct parser *P, uint64_t idx)
{
    struct pkl_value *v = memo_at(P, idx);
    if (!v)
        return fail(P, CKPT_EMEMO, "memo slot %" PRIu64 " was never stored", idx);
    return push(P, v);
}

/* Record in the prescan's bit set *ref (*words words, grown as needed) that memo slot get
 * is read: 0, -1 if the set would pass a quarter of the memory limit, or -ENOMEM. */
static int note_read(const struct parser *P, uint64_t **ref, size_t *words, uint64_t get)
{
    size_t w = (size_t)(get >> 6);
    if (w >= *words) {
        size_t n = *words ? *words : 64;
        while (n <= w)
            n *= 2;
        if (P->lim->max_memory && n * sizeof(**ref) > P->lim->max_memory / 4)
            return -1;
        uint64_t *r = realloc(*ref, n * sizeof(*r));
        if (!r)
            return -ENOMEM;
        memset(r + *words, 0, (n - *words) * sizeof(*r));
        *ref = r;
        *words = n;
    }
    (*ref)[w] |= (uint64_t)1 << (get & 63);
    return 0;
}

/* Give P the prescan's set of read slots (ref, words words; P owns it from here) and the
 * rank of each word and a value slot per read slot: 0, -1 if the slots are too many to
 * rank, or -ENOMEM. */
static int keep_reads(struct parser *P, uint64_t *ref, size_t words)
{
    P->ref = ref;
    P->ref_words = words;
    P->ref_rank = malloc((words + 1) * sizeof(*P->ref_rank));
    if (!P->ref_rank)
        return -ENOMEM;
    size_t n = 0;
    for (size_t w = 0; w < words; w++) {
        P->ref_rank[w] = (uint32_t)n;
        n += (size_t)popcount64(ref[w]);
    }
    if (n >= UINT32_MAX)
        return -1;
    P->refval = calloc(n + 1, sizeof(*P->refval));
    return P->refval ? 0 : -ENOMEM;
}

/* Fold mode's first pass: which memo slots does some BINGET/LONG_BINGET
 * read? Decodes every opcode's argument length up to STOP without building
 * anything. Returns 0 (P->ref filled), -1 if the input holds something it
 * does not decode (the parse then runs without folding and reports it), or
 * -ENOMEM. Reads of slots that cannot have been stored yet (beyond what
 * the stores so far can reach) are not recorded: the parse refuses them. */
static int prescan(struct parser *P)
{
    const uint8_t *in = P->in;
    size_t len = P->len, pos = 0;
    uint64_t reach = 0; /* highest memo index the stores so far can reach, + 1 */
    size_t words = 0;
    uint64_t *ref = NULL;
    int rc = -1;
    while (pos < len) {
        unsigned op = in[pos++];
        uint64_t arg = 0, get = UINT64_MAX;
        size_t left = len - pos;
        switch (op) {
        case OP_STOP:
            rc = 0;
            goto done;
        case OP_PROTO:
        case OP_BININT1:
            arg = 1;
            break;
        case OP_BINPUT:
        case OP_LONG_BINPUT:
        case OP_MEMOIZE:
            reach += 65537;
            arg = op == OP_BINPUT ? 1 : op == OP_LONG_BINPUT ? 4 : 0;
            break;
        case OP_BINGET:
            if (left < 1)
                goto done;
            get = in[pos];
            arg = 1;
            break;
        case OP_LONG_BINGET:
            if (left < 4)
                goto done;
            get = rd_le(in + pos, 4);
            arg = 4;
            break;
        case OP_BININT2:
            arg = 2;
            break;
        case OP_BININT:
            arg = 4;
            break;
        case OP_FRAME:
        case OP_BINFLOAT:
            arg = 8;
            break;
        case OP_LONG1:
        case OP_SHORT_BINUNICODE:
        case OP_SHORT_BINBYTES:
            if (left < 1)
                goto done;
            arg = 1 + (uint64_t)in[pos];
            break;
        case OP_LONG4:
        case OP_BINUNICODE:
        case OP_BINBYTES:
            if (left < 4)
                goto done;
            arg = rd_le(in + pos, 4);
            if (op == OP_LONG4 && (arg & 0x80000000u))
                goto done;
            arg += 4;
            break;
        case OP_BINUNICODE8:
        case OP_BINBYTES8:
        case OP_BYTEARRAY8:
            if (left < 8)
                goto done;
            arg = rd_le(in + pos, 8);
            if (arg > left - 8)
                goto done;
            arg += 8;
            break;
        case OP_GLOBAL:
            for (int line = 0; line < 2; line++) {
                const uint8_t *nl = memchr(in + pos + arg, '\n', left - (size_t)arg);
                if (!nl)
                    goto done;
                arg = (uint64_t)(nl - (in + pos)) + 1;
            }
            break;
        case OP_MARK:
        case OP_POP:
        case OP_POP_MARK:
        case OP_DUP:
        case OP_NONE:
        case OP_NEWTRUE:
        case OP_NEWFALSE:
        case OP_EMPTY_LIST:
        case OP_EMPTY_DICT:
        case OP_EMPTY_TUPLE:
        case OP_EMPTY_SET:
        case OP_TUPLE:
        case OP_TUPLE1:
        case OP_TUPLE2:
        case OP_TUPLE3:
        case OP_LIST:
        case OP_DICT:
        case OP_FROZENSET:
        case OP_APPEND:
        case OP_APPENDS:
        case OP_SETITEM:
        case OP_SETITEMS:
        case OP_ADDITEMS:
        case OP_STACK_GLOBAL:
        case OP_REDUCE:
        case OP_NEWOBJ:
        case OP_NEWOBJ_EX:
        case OP_BUILD:
            break;
        default:
            goto done;
        }
        if (arg > left)
            goto done;
        pos += (size_t)arg;
        assert(pos <= len);
        if (get == UINT64_MAX || get >= reach || get >= P->lim->max_memo)
            continue;
        int noted = note_read(P, &ref, &words, get);
        if (noted) {
            rc = noted;
            goto done;
        }
    }
done:
    if (rc) {
        free(ref);
        return rc;
    }
    return keep_reads(P, ref, words);
}

/* ---- objects ---------------------------------------------------------- */

static struct pkl_value *new_object(struct parser *P, struct pkl_value *cls, struct pkl_value *args,
                                    int how)
{
    struct pkl_value *v = newval(P, PKL_OBJECT);
    if (!v)
        return NULL;
    struct pkl_object *o = arena_zalloc(&P->doc->arena, sizeof(*o));
    if (!o) {
        oom(P);
        return NULL;
    }
    o->cls = cls;
    o->args = args;
    v->u.obj = o;
    v->how = (uint8_t)how;
    return v;
}

static int need_type(struct parser *P, const struct pkl_value *v, int type, const char *role)
{
    if (v->type != type)
        return fail(P, CKPT_ETYPE, "%s must be of type %s, got %s (created at byte %" PRIu64 ")",
                    role, pkl_type_name(type), pkl_type_name(v->type), v->pos);
    return 0;
}

/* ---- folding (fold mode) ------------------------------------------------ */

/* One attempt to read a DCP record at the current BINGET (see PKL_FOLDED in
 * pickle.h). The grammar, in opcodes, with [memo] an optional MEMOIZE,
 * BINPUT or LONG_BINPUT into a slot nothing reads and nothing stored yet:
 *   record := BINGET(class) EMPTY_TUPLE NEWOBJ [memo] EMPTY_DICT [memo]
 *             (MARK (key value)+ SETITEMS | key value SETITEM) BUILD
 *   key    := str, one of the class's field names, each at most once
 *   str    := (SHORT_BINUNICODE | BINUNICODE | BINUNICODE8) [memo] | BINGET(a str)
 *   int    := BININT1 | BININT2 | BININT | LONG1 of at most 8 bytes
 *   size   := BINGET(torch.Size) ints [memo] TUPLE1 [memo] REDUCE [memo]
 *   ints   := EMPTY_TUPLE | int{1,3} TUPLE1..3 | MARK int{0,64} TUPLE
 * Every check the plain parse would make on these opcodes is made here or
 * cannot fail (strs are valid UTF-8, marks and stack stay in their limits),
 * and nvalues grows by the values the plain parse would have made, so a
 * folded record stands for exactly the object the plain parse builds. On
 * any mismatch nothing is changed and the plain parse reads the opcodes. */
#define FM_MAX_STORES 32
#define FM_STACK 160 /* stack the plain parse could use inside one record */

struct fm {
    struct parser *P;
    size_t q; /* next byte */
    size_t memo_count, memo_len;
    uint64_t stores[FM_MAX_STORES];
    size_t nstores;
    size_t nvalues;
    uint64_t ops[4];
};

/* The next opcode, consumed, or -1 at the end of the input. */
static int fm_op(struct fm *F)
{
    if (F->q >= F->P->len)
        return -1;
    unsigned op = F->P->in[F->q++];
    F->ops[op >> 6] |= (uint64_t)1 << (op & 63);
    return (int)op;
}

/* Consume opcode op if it is next: 1, else 0. */
static int fm_take(struct fm *F, unsigned op)
{
    if (F->q >= F->P->len || F->P->in[F->q] != op)
        return 0;
    return fm_op(F) >= 0;
}

static const uint8_t *fm_bytes(struct fm *F, uint64_t n)
{
    if (n > F->P->len - F->q)
        return NULL;
    const uint8_t *p = F->P->in + F->q;
    F->q += (size_t)n;
    return p;
}

/* The next width bytes as a little-endian unsigned integer. 0, or -1: the
 * input ends first. */
static int fm_le(struct fm *F, unsigned width, uint64_t *out)
{
    const uint8_t *b = fm_bytes(F, width);
    if (!b)
        return -1;
    *out = rd_le(b, (int)width);
    return 0;
}

/* An optional memo store into a slot nothing reads. 0, or -1: no fold. */
static int fm_memo(struct fm *F)
{
    struct parser *P = F->P;
    uint64_t idx;
    if (F->q >= P->len)
        return 0;
    switch (P->in[F->q]) {
    case OP_MEMOIZE:
        fm_op(F);
        idx = F->memo_count;
        break;
    case OP_BINPUT:
        fm_op(F);
        if (fm_le(F, 1, &idx))
            return -1;
        break;
    case OP_LONG_BINPUT:
        fm_op(F);
        if (fm_le(F, 4, &idx))
            return -1;
        break;
    default:
        return 0;
    }
    if (idx >= P->lim->max_memo || idx > (uint64_t)F->memo_len + 65536 || ref_has(P, idx) ||
        set_has(P, idx) || F->nstores == FM_MAX_STORES)
        return -1;
    for (size_t i = 0; i < F->nstores; i++)
        if (F->stores[i] == idx)
            return -1;
    F->stores[F->nstores++] = idx;
    F->memo_count++;
    if (idx >= F->memo_len)
        F->memo_len = (size_t)idx + 1;
    return 0;
}

/* BINGET / LONG_BINGET of a stored slot: its value, or NULL (no fold). */
static const struct pkl_value *fm_get(struct fm *F)
{
    const uint8_t *b;
    if (fm_take(F, OP_BINGET))
        return (b = fm_bytes(F, 1)) ? memo_at(F->P, b[0]) : NULL;
    if (fm_take(F, OP_LONG_BINGET))
        return (b = fm_bytes(F, 4)) ? memo_at(F->P, rd_le(b, 4)) : NULL;
    return NULL;
}

static int fm_is_int(struct fm *F)
{
    if (F->q >= F->P->len)
        return 0;
    uint8_t op = F->P->in[F->q];
    return op == OP_BININT1 || op == OP_BININT2 || op == OP_BININT || op == OP_LONG1;
}

static int fm_int(struct fm *F, int64_t *out)
{
    const uint8_t *b;
    switch (fm_op(F)) {
    case OP_BININT1:
        if (!(b = fm_bytes(F, 1)))
            return -1;
        *out = b[0];
        break;
    case OP_BININT2:
        if (!(b = fm_bytes(F, 2)))
            return -1;
        *out = (int64_t)rd_le(b, 2);
        break;
    case OP_BININT:
        if (!(b = fm_bytes(F, 4)))
            return -1;
        *out = (int64_t)(int32_t)(uint32_t)rd_le(b, 4);
        break;
    case OP_LONG1: {
        if (!(b = fm_bytes(F, 1)))
            return -1;
        unsigned n = b[0];
        if (n > 8 || n > F->P->lim->max_long_bytes || !(b = fm_bytes(F, n)))
            return -1;
        *out = rd_long(b, n);
        break;
    }
    default:
        return -1;
    }
    F->nvalues++;
    return 0;
}

/* A str: *s points into the input (*fresh = 1: a new str) or into the
 * arena (a memoized str, read back). */
static int fm_str(struct fm *F, const char **s, size_t *n, int *fresh)
{
    const uint8_t *b;
    uint64_t len;
    if (F->q >= F->P->len)
        return -1;
    switch (F->P->in[F->q]) {
    case OP_SHORT_BINUNICODE:
    case OP_BINUNICODE:
    case OP_BINUNICODE8: {
        int op = fm_op(F);
        if (fm_le(F, op == OP_SHORT_BINUNICODE ? 1 : op == OP_BINUNICODE ? 4 : 8, &len))
            return -1;
        break;
    }
    default: {
        const struct pkl_value *v = fm_get(F);
        if (!v || v->type != PKL_STR)
            return -1;
        *s = v->u.str.s;
        *n = v->u.str.len;
        *fresh = 0;
        return 0;
    }
    }
    if (!(b = fm_bytes(F, len)) || utf8_bad(b, (size_t)len) != SIZE_MAX)
        return -1;
    *s = (const char *)b;
    *n = (size_t)len;
    *fresh = 1;
    F->nvalues++;
    return fm_memo(F);
}

/* torch.Size(tuple of ints) into a[64]. */
static int fm_size(struct fm *F, int64_t *a, uint32_t *n)
{
    const struct pkl_value *g = fm_get(F);
    if (!pkl_is_global(g, "torch", "Size"))
        return -1;
    uint32_t k = 0;
    if (fm_take(F, OP_EMPTY_TUPLE)) {
        k = 0;
    } else if (fm_take(F, OP_MARK)) { /* try_fold left room for this mark */
        while (fm_is_int(F))
            if (k == 64 || fm_int(F, &a[k++]))
                return -1;
        if (!fm_take(F, OP_TUPLE))
            return -1;
    } else {
        while (k < 3 && fm_is_int(F))
            if (fm_int(F, &a[k++]))
                return -1;
        if (!k || !fm_take(F, (unsigned)(OP_TUPLE1 + k - 1)))
            return -1;
    }
    F->nvalues++; /* the tuple */
    if (fm_memo(F) || !fm_take(F, OP_TUPLE1))
        return -1;
    F->nvalues++;
    if (fm_memo(F) || !fm_take(F, OP_REDUCE))
        return -1;
    F->nvalues++;
    *n = k;
    return fm_memo(F);
}

static const char *const fm_class[] = {NULL, "ChunkStorageMetadata", "MetadataIndex",
                                       "_StorageInfo"};
static const char *const fm_fields[][4] = {{NULL},
                                           {"offsets", "sizes", NULL},
                                           {"fqn", "index", "offset", NULL},
                                           {"relative_path", "offset", "length", NULL}};

/* Kind of record a BINGET of g may start (PKL_FOLD_*), or 0. */
static int fm_kind(const struct pkl_value *g)
{
    if (!g || g->type != PKL_GLOBAL ||
        strncmp(g->u.global.module, "torch.distributed.", strlen("torch.distributed.")) != 0)
        return 0;
    for (int k = 1; k <= 3; k++)
        if (strcmp(g->u.global.name, fm_class[k]) == 0)
            return k;
    return 0;
}

/* key value: one field of a record of kind k into *f; seen: fields so far. */
static int fm_field(struct fm *F, int k, struct pkl_fold *f, unsigned *seen, int64_t a[2][64],
                    const char **str, int *fresh)
{
    const char *key;
    size_t klen;
    int kfresh;
    if (fm_str(F, &key, &klen, &kfresh))
        return -1;
    int i = 0;
    for (; fm_fields[k][i]; i++)
        if (strlen(fm_fields[k][i]) == klen && memcmp(fm_fields[k][i], key, klen) == 0)
            break;
    if (!fm_fields[k][i] || (*seen & (1u << i)))
        return -1;
    *seen |= 1u << i;
    if (k == PKL_FOLD_CHUNK)
        return fm_size(F, a[i], i == 0 ? &f->noffs : &f->nsizes);
    if (k == PKL_FOLD_INDEX) {
        if (i == 0)
            return fm_str(F, str, &f->len, fresh);
        if (fm_take(F, OP_NONE))
            return 0;
        if (i == 1) {
            f->has_index = 1;
            return fm_int(F, &f->index);
        }
        return fm_size(F, a[0], &f->noffs);
    }
    if (i == 0)
        return fm_str(F, str, &f->len, fresh);
    return fm_int(F, i == 1 ? &f->off : &f->size);
}

/* Try to fold the record starting at the BINGET at P->oppos: 1 if folded
 * (pushed, P->pos past it), 0 if not (nothing changed), or an error code. */
static int try_fold(struct parser *P)
{
    /* room for the stack and the two marks the plain parse could use */
    if (P->sp + FM_STACK > P->lim->max_stack || P->nmarks + 2 > P->lim->max_marks)
        return 0;
    struct fm F = {.P = P, .q = P->oppos, .memo_count = P->memo_count, .memo_len = P->memo_len};
    const struct pkl_value *cls = fm_get(&F);
    int k = fm_kind(cls);
    if (!k || !fm_take(&F, OP_EMPTY_TUPLE))
        return 0;
    struct pkl_fold f = {.kind = k, .cls = cls, .noffs = PKL_FOLD_NOSHAPE};
    int64_t a[2][64];
    const char *str = NULL;
    int fresh = 0;
    unsigned seen = 0;
    F.nvalues = 1; /* the empty tuple */
    if (!fm_take(&F, OP_NEWOBJ))
        return 0;
    F.nvalues++;
    if (fm_memo(&F) || !fm_take(&F, OP_EMPTY_DICT))
        return 0;
    F.nvalues++;
    if (fm_memo(&F))
        return 0;
    if (fm_take(&F, OP_MARK)) {
        do {
            if (fm_field(&F, k, &f, &seen, a, &str, &fresh))
                return 0;
        } while (!fm_take(&F, OP_SETITEMS));
    } else if (fm_field(&F, k, &f, &seen, a, &str, &fresh) || !fm_take(&F, OP_SETITEM)) {
        return 0;
    }
    if (!fm_take(&F, OP_BUILD))
        return 0;
    unsigned need = k == PKL_FOLD_CHUNK ? 3 : k == PKL_FOLD_INDEX ? 1 : 7;
    if ((seen & need) != need)
        return 0;

    /* commit: the value, its arrays and string in the document's arena */
    assert(F.q > P->oppos && F.q <= P->len);
    assert(F.memo_len <= P->lim->max_memo && F.nstores <= FM_MAX_STORES);
    assert(f.noffs == PKL_FOLD_NOSHAPE || f.noffs <= 64);
    assert(f.nsizes <= 64);
    struct arena *A = &P->doc->arena;
    struct pkl_value *v = arena_alloc(A, sizeof(*v));
    struct pkl_fold *fp = arena_alloc(A, sizeof(*fp));
    if (!v || !fp)
        return oom(P);
    *fp = f;
    if (k != PKL_FOLD_STORAGE && f.noffs != PKL_FOLD_NOSHAPE) {
        uint32_t na = f.noffs;
        int64_t *o = arena_alloc(A, (na ? na : 1) * sizeof(int64_t));
        if (!o)
            return oom(P);
        memcpy(o, a[0], na * sizeof(int64_t));
        fp->offs = o;
    }
    if (k == PKL_FOLD_CHUNK) {
        int64_t *z = arena_alloc(A, (f.nsizes ? f.nsizes : 1) * sizeof(int64_t));
        if (!z)
            return oom(P);
        memcpy(z, a[1], f.nsizes * sizeof(int64_t));
        fp->sizes = z;
    }
    /* a str read from the memo is in the arena already; a new one is copied */
    fp->str = str && fresh ? arena_strndup(A, str, fp->len) : str;
    if (str && !fp->str)
        return oom(P);
    for (size_t i = 0; i < F.nstores; i++) {
        int added = set_add(P, F.stores[i]);
        if (added < 0)
            return oom(P);
        P->memo_count += (size_t)added;
    }
    P->memo_len = F.memo_len;
    for (int i = 0; i < 4; i++)
        P->doc->opcodes[i] |= F.ops[i];
    P->doc->nvalues += F.nvalues;
    P->doc->nfolded++;
    memset(v, 0, sizeof(*v));
    v->type = PKL_FOLDED;
    v->pos = P->oppos;
    v->u.fold = fp;
    P->pos = F.q;
    int rc = push(P, v);
    return rc ? rc : 1;
}

/* ---- main loop -------------------------------------------------------- */

static int step(struct parser *P)
{
    const struct pkl_limits *L = P->lim;
    int rc;
    uint64_t n;
    size_t k = 0;
    struct pkl_value *v;

    switch (P->op) {
    case OP_PROTO:
        if ((rc = need(P, 1, "PROTO argument")))
            return rc;
        n = P->in[P->pos++];
        if (n > 5)
            return fail(P, CKPT_EOPCODE, "unsupported pickle protocol %" PRIu64, n);
        if ((int)n < L->min_protocol)
            return fail(P, CKPT_EOPCODE, "pickle protocol %" PRIu64 " is below the minimum %d", n,
                        L->min_protocol);
        P->doc->protocol = (int)n;
        return 0;
    case OP_FRAME:
        if ((rc = need(P, 8, "FRAME length")))
            return rc;
        n = rd_le(P->in + P->pos, 8);
        P->pos += 8;
        if (n > P->len - P->pos)
            return fail(P, CKPT_ETRUNC,
                        "frame of %" PRIu64 " bytes extends past the end of input (%zu remain)", n,
                        P->len - P->pos);
        return 0;
    case OP_STOP:
        return 0; /* handled by the caller */
    case OP_MARK:
        if (P->nmarks == P->mcap) {
            if (P->nmarks >= L->max_marks)
                return fail(P, CKPT_ELIMIT, "more than %zu open MARKs", L->max_marks);
            size_t ncap = P->mcap ? P->mcap * 2 : 16;
            if (ncap > L->max_marks)
                ncap = L->max_marks;
            size_t *m = realloc(P->marks, ncap * sizeof(*m));
            if (!m)
                return oom(P);
            P->marks = m;
            P->mcap = ncap;
        }
        assert(P->nmarks < P->mcap && P->mcap <= L->max_marks);
        assert(!P->nmarks || P->marks[P->nmarks - 1] <= P->sp); /* marks only grow upwards */
        P->marks[P->nmarks++] = P->sp;
        return 0;
    case OP_POP:
        if (P->sp > base(P)) {
            P->sp--;
            return 0;
        }
        if (P->nmarks) {
            P->nmarks--;
            return 0;
        }
        return fail(P, CKPT_ESTACK, "POP with an empty stack");
    case OP_POP_MARK:
        if ((rc = pop_mark(P, &k)))
            return rc;
        P->sp = k;
        return 0;
    case OP_DUP:
        if ((rc = have(P, 1)))
            return rc;
        return push(P, P->stack[P->sp - 1]);

    /* scalars */
    case OP_NONE:
        return push(P, P->none);
    case OP_NEWTRUE:
        return push(P, P->vtrue);
    case OP_NEWFALSE:
        return push(P, P->vfalse);
    case OP_BININT1:
    case OP_BININT2:
    case OP_BININT: {
        int w = P->op == OP_BININT1 ? 1 : P->op == OP_BININT2 ? 2 : 4;
        if ((rc = need(P, (uint64_t)w, "integer argument")))
            return rc;
        uint64_t u = rd_le(P->in + P->pos, w);
        P->pos += (size_t)w;
        if (!(v = newval(P, PKL_INT)))
            return P->rc;
        v->u.i = w == 4 ? (int64_t)(int32_t)(uint32_t)u : (int64_t)u;
        return push(P, v);
    }
    case OP_LONG1:
        if ((rc = need(P, 1, "LONG1 length")))
            return rc;
        n = P->in[P->pos++];
        return push_long(P, n);
    case OP_LONG4: {
        if ((rc = need(P, 4, "LONG4 length")))
            return rc;
        int32_t sn = (int32_t)(uint32_t)rd_le(P->in + P->pos, 4);
        P->pos += 4;
        if (sn < 0)
            return fail(P, CKPT_EFORMAT, "LONG4 with negative length %d", (int)sn);
        return push_long(P, (uint64_t)sn);
    }
    case OP_BINFLOAT: {
        if ((rc = need(P, 8, "BINFLOAT argument")))
            return rc;
        uint64_t u = 0;
        for (int i = 0; i < 8; i++)
            u = (u << 8) | P->in[P->pos + i]; /* big-endian */
        P->pos += 8;
        if (!(v = newval(P, PKL_FLOAT)))
            return P->rc;
        memcpy(&v->u.f, &u, sizeof(u));
        return push(P, v);
    }

    /* strings and bytes */
    case OP_SHORT_BINUNICODE:
    case OP_SHORT_BINBYTES:
        if ((rc = need(P, 1, "length")))
            return rc;
        n = P->in[P->pos++];
        return push_str(P, n, P->op == OP_SHORT_BINUNICODE ? PKL_STR : PKL_BYTES, 0);
    case OP_BINUNICODE:
    case OP_BINBYTES:
        if ((rc = need(P, 4, "length")))
            return rc;
        n = rd_le(P->in + P->pos, 4);
        P->pos += 4;
        return push_str(P, n, P->op == OP_BINUNICODE ? PKL_STR : PKL_BYTES, 0);
    case OP_BINUNICODE8:
    case OP_BINBYTES8:
    case OP_BYTEARRAY8:
        if ((rc = need(P, 8, "length")))
            return rc;
        n = rd_le(P->in + P->pos, 8);
        P->pos += 8;
        return push_str(P, n, P->op == OP_BINUNICODE8 ? PKL_STR : PKL_BYTES,
                        P->op == OP_BYTEARRAY8 ? PKL_F_BYTEARRAY : 0);

    /* containers */
    case OP_EMPTY_LIST:
        return push(P, newval(P, PKL_LIST));
    case OP_EMPTY_DICT:
        return push(P, newval(P, PKL_DICT));
    case OP_EMPTY_TUPLE:
        return push(P, newval(P, PKL_TUPLE));
    case OP_EMPTY_SET:
        return push(P, newval(P, PKL_SET));
    case OP_TUPLE1:
    case OP_TUPLE2:
    case OP_TUPLE3: {
        size_t cnt = (size_t)(P->op - OP_TUPLE1 + 1);
        if ((rc = have(P, cnt)))
            return rc;
        if (!(v = newval(P, PKL_TUPLE)))
            return P->rc;
        if ((rc = seq_append(P, v, P->stack + P->sp - cnt, cnt)))
            return rc;
        tuple_seal(v);
        P->sp -= cnt;
        return push(P, v);
    }
    case OP_TUPLE:
    case OP_LIST:
    case OP_FROZENSET:
    case OP_DICT: {
        if ((rc = pop_mark(P, &k)))
            return rc;
        int type = P->op == OP_TUPLE  ? PKL_TUPLE
                   : P->op == OP_LIST ? PKL_LIST
                   : P->op == OP_DICT ? PKL_DICT
                                      : PKL_FROZENSET;
        size_t cnt = P->sp - k;
        if (!(v = newval(P, type)))
            return P->rc;
        if (type == PKL_DICT) {
            if (cnt % 2)
                return fail(P, CKPT_ESTACK, "DICT with an odd number (%zu) of stack items", cnt);
            rc = dict_add(P, v, P->stack + k, cnt);
        } else {
            rc = seq_append(P, v, P->stack + k, cnt);
        }
        if (rc)
            return rc;
        if (type == PKL_TUPLE)
            tuple_seal(v);
        P->sp = k;
        return push(P, v);
    }
    case OP_APPEND:
        if ((rc = have(P, 2)))
            return rc;
        rc = list_add(P, P->stack[P->sp - 2], P->stack + P->sp - 1, 1);
        P->sp--;
        return rc;
    case OP_SETITEM:
        if ((rc = have(P, 3)))
            return rc;
        rc = dict_add(P, P->stack[P->sp - 3], P->stack + P->sp - 2, 2);
        P->sp -= 2;
        return rc;
    case OP_APPENDS:
    case OP_SETITEMS:
    case OP_ADDITEMS: {
        if ((rc = pop_mark(P, &k)))
            return rc;
        if (k == 0 || k - 1 < base(P))
            return fail(P, CKPT_ESTACK, "no target value below the MARK");
        struct pkl_value *target = P->stack[k - 1];
        size_t cnt = P->sp - k;
        if (P->op == OP_APPENDS) {
            rc = list_add(P, target, P->stack + k, cnt);
        } else if (P->op == OP_SETITEMS) {
            if (cnt % 2)
                return fail(P, CKPT_ESTACK, "SETITEMS with an odd number (%zu) of stack items",
                            cnt);
            rc = dict_add(P, target, P->stack + k, cnt);
        } else {
            if (target->type != PKL_SET)
                return fail(P, CKPT_ETYPE, "ADDITEMS target must be a set, got a %s",
                            pkl_type_name(target->type));
            rc = seq_append(P, target, P->stack + k, cnt);
        }
        P->sp = k;
        return rc;
    }

    /* memo */
    case OP_BINPUT:
        if ((rc = need(P, 1, "BINPUT index")))
            return rc;
        return memo_put(P, P->in[P->pos++]);
    case OP_LONG_BINPUT:
        if ((rc = need(P, 4, "LONG_BINPUT index")))
            return rc;
        n = rd_le(P->in + P->pos, 4);
        P->pos += 4;
        return memo_put(P, n);
    case OP_MEMOIZE:
        return memo_put(P, P->memo_count);
    case OP_BINGET:
        if ((rc = need(P, 1, "BINGET index")))
            return rc;
        return memo_get(P, P->in[P->pos++]);
    case OP_LONG_BINGET:
        if ((rc = need(P, 4, "LONG_BINGET index")))
            return rc;
        n = rd_le(P->in + P->pos, 4);
        P->pos += 4;
        return memo_get(P, n);

    /* class references and objects */
    case OP_GLOBAL: {
        const char *m = NULL, *nm = NULL; /* set by read_line; initialised for -O3 */
        size_t ml = 0, nl = 0;
        if ((rc = read_line(P, &m, &ml)) || (rc = read_line(P, &nm, &nl)))
            return rc;
        return push_global(P, m, ml, nm, nl);
    }
    case OP_STACK_GLOBAL: {
        if ((rc = have(P, 2)))
            return rc;
        struct pkl_value *mod = P->stack[P->sp - 2], *name = P->stack[P->sp - 1];
        if ((rc = need_type(P, mod, PKL_STR, "STACK_GLOBAL module")) ||
            (rc = need_type(P, name, PKL_STR, "STACK_GLOBAL name")))
            return rc;
        P->sp -= 2;
        return push_global(P, mod->u.str.s, mod->u.str.len, name->u.str.s, name->u.str.len);
    }
    case OP_REDUCE:
    case OP_NEWOBJ: {
        if ((rc = have(P, 2)))
            return rc;
        struct pkl_value *cls = P->stack[P->sp - 2], *args = P->stack[P->sp - 1];
        const char *role = P->op == OP_REDUCE ? "REDUCE callable" : "NEWOBJ class";
        if ((rc = need_type(P, cls, PKL_GLOBAL, role)) ||
            (rc = need_type(P, args, PKL_TUPLE, "argument list")))
            return rc;
        if (!(v = new_object(P, cls, args, P->op == OP_REDUCE ? PKL_HOW_REDUCE : PKL_HOW_NEWOBJ)))
            return P->rc;
        P->sp -= 2;
        return push(P, v);
    }
    case OP_NEWOBJ_EX: {
        if ((rc = have(P, 3)))
            return rc;
        struct pkl_value *cls = P->stack[P->sp - 3], *args = P->stack[P->sp - 2],
                         *kw = P->stack[P->sp - 1];
        if ((rc = need_type(P, cls, PKL_GLOBAL, "NEWOBJ_EX class")) ||
            (rc = need_type(P, args, PKL_TUPLE, "argument list")) ||
            (rc = need_type(P, kw, PKL_DICT, "keyword arguments")))
            return rc;
        if (!(v = new_object(P, cls, args, PKL_HOW_NEWOBJ_EX)))
            return P->rc;
        v->u.obj->kwargs = kw;
        P->sp -= 3;
        return push(P, v);
    }
    case OP_BUILD: {
        if ((rc = have(P, 2)))
            return rc;
        struct pkl_value *target = P->stack[P->sp - 2], *state = P->stack[P->sp - 1];
        if ((rc = need_type(P, target, PKL_OBJECT, "BUILD target")))
            return rc;
        target->u.obj->state = state;
        P->sp--;
        return 0;
    }

    /* refused */
    case OP_INT:
    case OP_LONG:
    case OP_FLOAT:
    case OP_STRING:
    case OP_UNICODE:
    case OP_PUT:
    case OP_GET:
    case OP_INST:
    case OP_OBJ:
        return fail(P, CKPT_EOPCODE, "protocol-0 text opcode is not supported");
    case OP_BINSTRING:
    case OP_SHORT_BINSTRING:
        return fail(P, CKPT_EOPCODE, "Python 2 str opcodes are not supported");
    case OP_PERSID:
    case OP_BINPERSID:
        return fail(P, CKPT_EOPCODE, "persistent ids are not supported");
    case OP_EXT1:
    case OP_EXT2:
    case OP_EXT4:
        return fail(P, CKPT_EOPCODE, "extension registry codes are not supported");
    case OP_NEXT_BUFFER:
    case OP_READONLY_BUFFER:
        return fail(P, CKPT_EOPCODE, "out-of-band buffers are not supported");
    default:
        return fail(P, CKPT_EOPCODE, "unknown opcode");
    }
}

static void parser_release(struct parser *P)
{
    free(P->stack);
    free(P->marks);
    free(P->memo);
    free(P->ref);
    free(P->ref_rank);
    free(P->refval);
    free(P->set);
    strmap_free(&P->globals);
}

void pkl_free(struct pkl_doc *doc)
{
    if (!doc)
        return;
    arena_release(&doc->arena);
    free(doc->global_module);
    free(doc->global_name);
    free(doc);
}

int pkl_parse(const void *buf, size_t len, const struct pkl_options *opt, struct pkl_doc **out,
              struct ckpt_err *err)
{
    struct pkl_options defaults;
    if (!opt) {
        pkl_options_default(&defaults);
        opt = &defaults;
    }
    *out = NULL;
    ckpt_err_clear(err);
    struct parser P;
    memset(&P, 0, sizeof(P));
    P.in = buf;
    P.len = len;
    P.opt = opt;
    P.lim = &opt->lim;
    P.err = err;
    P.op = 0x100; /* no opcode yet */

    if (len == 0)
        return ckpt_err_set(err, CKPT_ETRUNC, 0, "pickle: empty input");
    if (opt->lim.max_input && len > opt->lim.max_input)
        return ckpt_err_set(err, CKPT_ELIMIT, 0,
                            "pickle: input of %zu bytes exceeds the limit of %zu", len,
                            opt->lim.max_input);

    P.doc = calloc(1, sizeof(*P.doc));
    if (!P.doc)
        return ckpt_err_set(err, -ENOMEM, 0, "pickle: out of memory");
    arena_init(&P.doc->arena, opt->lim.max_memory);
    if (!(P.none = newval(&P, PKL_NONE)) || !(P.vtrue = newval(&P, PKL_BOOL)) ||
        !(P.vfalse = newval(&P, PKL_BOOL)))
        goto out;
    P.vtrue->u.b = 1;
    P.scap = opt->lim.max_stack && opt->lim.max_stack < 64 ? opt->lim.max_stack : 64;
    if (!(P.stack = malloc(P.scap * sizeof(*P.stack)))) {
        oom(&P);
        goto out;
    }

    if (opt->fold) {
        int pre = prescan(&P);
        if (pre == -ENOMEM) {
            oom(&P);
            goto out;
        }
        P.fold = pre == 0;
    }

    if (P.in[0] != OP_PROTO && opt->lim.min_protocol >= 2) {
        P.oppos = 0;
        P.op = P.in[0];
        fail(&P, CKPT_EOPCODE,
             "no PROTO opcode: protocol 0/1 pickles are not supported (need protocol >= %d)",
             opt->lim.min_protocol);
        goto out;
    }
    for (;;) {
        assert(machine_consistent(&P));
        if (P.pos >= P.len) {
            P.oppos = P.pos;
            P.op = 0x100;
            ckpt_err_set(err, CKPT_ETRUNC, P.pos, "pickle: input ends at byte %zu before STOP",
                         P.pos);
            P.rc = CKPT_ETRUNC;
            goto out;
        }
        P.oppos = P.pos;
        P.op = P.in[P.pos++];
        P.doc->opcodes[P.op >> 6] |= (uint64_t)1 << (P.op & 63);
        if (P.op == OP_STOP) {
            if (P.nmarks) {
                fail(&P, CKPT_ESTACK, "STOP with %zu MARK(s) still open", P.nmarks);
                goto out;
            }
            if (P.sp != 1) {
                if (P.sp)
                    fail(&P, CKPT_ESTACK, "STOP with %zu values on the stack (want 1)", P.sp);
                else
                    fail(&P, CKPT_ESTACK, "STOP with an empty stack");
                goto out;
            }
            break;
        }
        if (P.fold && (P.op == OP_BINGET || P.op == OP_LONG_BINGET)) {
            int folded = try_fold(&P);
            if (folded < 0)
                goto out;
            if (folded)
                continue;
        }
        if (step(&P))
            goto out;
    }
    assert(P.sp == 1 && P.nmarks == 0 && P.pos <= P.len);
    P.doc->root = P.stack[0];
    P.doc->end = P.pos;
    if (P.pos < P.len && !opt->lim.allow_trailing) {
        ckpt_err_set(err, CKPT_EFORMAT, P.pos, "pickle: %zu bytes after STOP at byte %zu",
                     P.len - P.pos, P.pos - 1);
        P.rc = CKPT_EFORMAT;
        goto out;
    }
    parser_release(&P);
    *out = P.doc;
    return 0;
out:
    if (!P.rc)
        P.rc = err && err->code ? err->code : -ENOMEM;
    parser_release(&P);
    pkl_free(P.doc);
    return P.rc;
}

/* ---- helpers ---------------------------------------------------------- */

int pkl_is_global(const struct pkl_value *v, const char *module, const char *name)
{
    return v && v->type == PKL_GLOBAL && strcmp(v->u.global.module, module) == 0 &&
           strcmp(v->u.global.name, name) == 0;
}

const struct pkl_value *pkl_class_of(const struct pkl_value *v)
{
    if (!v)
        return NULL;
    if (v->type == PKL_GLOBAL)
        return v;
    if (v->type == PKL_OBJECT)
        return v->u.obj->cls;
    return NULL;
}

const struct pkl_value *pkl_dict_get(const struct pkl_value *dict, const char *key)
{
    if (!dict || dict->type != PKL_DICT)
        return NULL;
    size_t klen = strlen(key);
    for (size_t i = 0; i + 1 < dict->u.seq.len; i += 2) {
        const struct pkl_value *k = dict->u.seq.items[i];
        if (k->type == PKL_STR && k->u.str.len == klen && memcmp(k->u.str.s, key, klen) == 0)
            return dict->u.seq.items[i + 1];
    }
    return NULL;
}

/* ---- repr ------------------------------------------------------------- */

struct out {
    char *buf;
    size_t len, cap; /* cap includes room for the NUL */
    int full;
};

static void out_str(struct out *o, const char *s, size_t n)
{
    if (o->full)
        return;
    if (n > o->cap - 1 - o->len) {
        n = o->cap - 1 - o->len;
        o->full = 1;
    }
    memcpy(o->buf + o->len, s, n);
    o->len += n;
    o->buf[o->len] = '\0';
}

static void out_fmt(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void out_fmt(struct out *o, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n > 0)
        out_str(o, tmp, (size_t)n < sizeof(tmp) ? (size_t)n : sizeof(tmp) - 1);
}

static void out_quoted(struct out *o, const char *s, size_t n, int is_bytes)
{
    out_str(o, is_bytes ? "b'" : "'", is_bytes ? 2 : 1);
    for (size_t i = 0; i < n && !o->full; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\'' || c == '\\')
            out_fmt(o, "\\%c", c);
        else if (c < 0x20 || c == 0x7f || (is_bytes && c >= 0x80))
            out_fmt(o, "\\x%02x", c);
        else
            out_str(o, (const char *)&c, 1);
    }
    out_str(o, "'", 1);
}

struct task {
    const struct pkl_value *v; /* NULL: literal */
    const char *lit;
    size_t depth;
};

void pkl_repr(const struct pkl_value *root, char *buf, size_t buflen, size_t max_depth,
              size_t max_nodes)
{
    if (!buf || !buflen)
        return;
    struct out o = {buf, 0, buflen, 0};
    buf[0] = '\0';
    size_t cap = 64, n = 0, nodes = 0;
    struct task *st = malloc(cap * sizeof(*st));
    if (!st)
        return;
    st[n++] = (struct task){root, NULL, 0};
    while (n && !o.full) {
        struct task t = st[--n];
        if (!t.v) {
            out_str(&o, t.lit, strlen(t.lit));
            continue;
        }
        const struct pkl_value *v = t.v;
        if (++nodes > max_nodes || t.depth > max_depth) {
            out_str(&o, "...", 3);
            continue;
        }
        /* children are pushed in reverse; each push reserves room first */
        size_t want = 8;
        if (v->type >= PKL_TUPLE && v->type <= PKL_FROZENSET)
            want += 2 * v->u.seq.len + 4;
        if (v->type == PKL_OBJECT)
            want += 16;
        if (want > max_nodes * 2 + 16)
            want = max_nodes * 2 + 16;
        if (n + want > cap) {
            size_t ncap = cap;
            while (n + want > ncap)
                ncap *= 2;
            struct task *s2 = realloc(st, ncap * sizeof(*st));
            if (!s2)
                break;
            st = s2;
            cap = ncap;
        }
#define PUSHV(x) (st[n++] = (struct task){(x), NULL, t.depth + 1})
#define PUSHL(x) (st[n++] = (struct task){NULL, (x), 0})
        switch (v->type) {
        case PKL_NONE:
            out_str(&o, "None", 4);
            break;
        case PKL_BOOL:
            out_str(&o, v->u.b ? "True" : "False", v->u.b ? 4 : 5);
            break;
        case PKL_INT:
            out_fmt(&o, "%" PRId64, v->u.i);
            break;
        case PKL_BIGINT:
            out_fmt(&o, "<int of %zu bytes>", v->u.str.len);
            break;
        case PKL_FLOAT:
            out_fmt(&o, "%.17g", v->u.f);
            break;
        case PKL_STR:
        case PKL_BYTES:
            out_quoted(&o, v->u.str.s, v->u.str.len, v->type == PKL_BYTES);
            break;
        case PKL_GLOBAL:
            out_fmt(&o, "%s", v->u.global.module);
            out_str(&o, ".", 1);
            out_str(&o, v->u.global.name, strlen(v->u.global.name));
            break;
        case PKL_TUPLE:
        case PKL_LIST:
        case PKL_SET:
        case PKL_FROZENSET:
        case PKL_DICT: {
            const char *open = v->type == PKL_TUPLE  ? "("
                               : v->type == PKL_LIST ? "["
                               : v->type == PKL_DICT ? "{"
                               : v->type == PKL_SET  ? "{"
                                                     : "frozenset({";
            const char *close = v->type == PKL_TUPLE       ? (v->u.seq.len == 1 ? ",)" : ")")
                                : v->type == PKL_LIST      ? "]"
                                : v->type == PKL_FROZENSET ? "})"
                                                           : "}";
            out_str(&o, open, strlen(open));
            size_t cnt = v->u.seq.len;
            size_t shown = cnt;
            if (shown > (want - 12) / 2)
                shown = (want - 12) / 2;
            PUSHL(close);
            if (shown < cnt)
                PUSHL(", ...");
            for (size_t i = shown; i-- > 0;) {
                PUSHV(v->u.seq.items[i]);
                if (i)
                    PUSHL(v->type == PKL_DICT ? (i % 2 ? ": " : ", ") : ", ");
            }
            break;
        }
        case PKL_OBJECT: {
            const struct pkl_object *ob = v->u.obj;
            PUSHL(")");
            if (ob->dictitems) {
                PUSHV(ob->dictitems);
                PUSHL(", items=");
            }
            if (ob->listitems) {
                PUSHV(ob->listitems);
                PUSHL(", list=");
            }
            if (ob->state) {
                PUSHV(ob->state);
                PUSHL(", state=");
            }
            if (ob->kwargs) {
                PUSHV(ob->kwargs);
                PUSHL(", kwargs=");
            }
            PUSHV(ob->args);
            PUSHL("(args=");
            PUSHV(ob->cls);
            break;
        }
        case PKL_FOLDED:
            out_fmt(&o, "<%s record>", v->u.fold->cls->u.global.name);
            break;
        default:
            out_str(&o, "?", 1);
        }
#undef PUSHV
#undef PUSHL
    }
    if (o.full && buflen >= 4)
        memcpy(buf + buflen - 4, "...", 4);
    free(st);
}
