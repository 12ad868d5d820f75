/*
 * index/pickle.h - a bounded, non-executing pickle reader.
 *
 * pkl_parse() turns a pickle (protocols 2-5, the binary opcodes Python's
 * pickle.dump writes) into a graph of plain values: None, bool, int (64-bit,
 * or a raw little-endian two's-complement big integer), float, str, bytes,
 * tuple, list, dict, set, frozenset, a class/function reference ("global":
 * module + name) and an "object" = reference + constructor args + BUILD
 * state. Nothing is ever imported, resolved or called: classes are data.
 *
 * Python semantics kept: the memo shares values (a BINGET pushes the same
 * value, so lists may be shared or even contain themselves); APPEND/SETITEM
 * mutate the shared value; MARK starts a fresh stack region that pops may not
 * cross. Python semantics dropped, on purpose:
 *   - dicts are ordered (key, value) pair lists; keys are not de-duplicated
 *     (consumers such as dcp.c reject duplicates they care about); list,
 *     dict, set and bytearray keys are refused as unhashable;
 *   - APPEND(S)/SETITEM(S)/ADDITEMS on an object are recorded on the object
 *     (listitems / dictitems) instead of calling a method;
 *   - STOP must leave exactly one value and no open MARK (CPython ignores
 *     the rest).
 *
 * Refused with a CKPT_E* code, the opcode's byte position and a message:
 * unknown opcodes; protocol-0/1 text opcodes (INT, LONG, STRING, UNICODE,
 * FLOAT, PUT, GET, INST, OBJ, ...) and PERSID/BINPERSID, EXT1/2/4,
 * NEXT_BUFFER/READONLY_BUFFER; a missing PROTO (protocol 0/1) unless
 * min_protocol allows it; PROTO > 5; truncation and any declared length
 * beyond the input (checked before allocating); stack underflow, pops across
 * a MARK, STOP with marks open; undefined or sparse memo indexes; BUILD,
 * REDUCE, NEWOBJ, APPEND, SETITEM on values of the wrong kind; invalid
 * UTF-8 (surrogates are accepted, as CPython's "surrogatepass" does); GLOBALs
 * rejected by the caller's filter; and every limit in struct pkl_limits.
 *
 * No recursion: parsing uses an explicit stack, freeing releases the arena,
 * and pkl_repr() walks with an explicit stack under depth and node budgets.
 * Memory is bounded by max_memory; each opcode allocates O(1) values, so
 * amplification is linear in the input (memo references are never copied).
 */
#ifndef CKPTFS_PICKLE_H
#define CKPTFS_PICKLE_H

#include <stddef.h>
#include <stdint.h>

#include "arena.h"
#include "ckpt.h"

enum pkl_type {
    PKL_NONE = 1,
    PKL_BOOL,
    PKL_INT,    /* fits int64: u.i */
    PKL_BIGINT, /* LONG1/LONG4 beyond int64: u.str = raw little-endian bytes */
    PKL_FLOAT,
    PKL_STR,   /* UTF-8, NUL-terminated copy; may contain NUL (use len) */
    PKL_BYTES, /* flags PKL_F_BYTEARRAY for BYTEARRAY8 */
    PKL_TUPLE,
    PKL_LIST,
    PKL_DICT, /* u.seq.items = key0, val0, key1, val1, ...; len = 2 * pairs */
    PKL_SET,
    PKL_FROZENSET,
    PKL_GLOBAL, /* GLOBAL / STACK_GLOBAL: u.global */
    PKL_OBJECT, /* REDUCE / NEWOBJ / NEWOBJ_EX result: u.obj */
    PKL_FOLDED  /* only with pkl_options.fold: a DCP record, u.fold (see below) */
};

#define PKL_F_BYTEARRAY 1
#define PKL_F_UNHASHABLE 2 /* tuple holding a list, dict or set (set when built) */
#define PKL_HOW_REDUCE 1
#define PKL_HOW_NEWOBJ 2
#define PKL_HOW_NEWOBJ_EX 3

struct pkl_value;

/* Fold mode (pkl_options.fold, for dcp.c): an object built exactly the way
 * torch's pickler writes a DCP ChunkStorageMetadata, MetadataIndex or
 * _StorageInfo (BINGET class, EMPTY_TUPLE, NEWOBJ, EMPTY_DICT, the known
 * fields of the right types set by SETITEM(S), BUILD; sizes as
 * REDUCE(torch.Size, (tuple of ints,))), whose memo slots no BINGET ever
 * reads, is kept as one PKL_FOLDED value holding what dcp.c extracts from
 * such an object, instead of ~15 values. Anything else stays a plain value.
 * A folded record never changes: a later BUILD, APPEND or SETITEM on it is
 * refused (CKPT_ETYPE) where the plain parse would change the object, so
 * fold mode may refuse what the plain parse accepts (dcp.c then parses
 * again without folding), never the other way round. */
#define PKL_FOLD_CHUNK 1   /* ChunkStorageMetadata: offsets, sizes */
#define PKL_FOLD_INDEX 2   /* MetadataIndex: fqn, index, offset */
#define PKL_FOLD_STORAGE 3 /* _StorageInfo: relative_path, offset, length */
#define PKL_FOLD_NOSHAPE UINT32_MAX

struct pkl_fold {
    int kind;                    /* PKL_FOLD_* */
    const struct pkl_value *cls; /* the class (PKL_GLOBAL) */
    uint32_t noffs, nsizes;      /* dims; INDEX noffs: PKL_FOLD_NOSHAPE if None/absent */
    const int64_t *offs, *sizes; /* CHUNK offsets/sizes, INDEX offset */
    const char *str;             /* INDEX fqn, STORAGE relative_path (valid UTF-8) */
    size_t len;
    int has_index;     /* INDEX: index is an int (else None/absent) */
    int64_t index;     /* INDEX */
    int64_t off, size; /* STORAGE offset, length */
};

struct pkl_object {
    struct pkl_value *cls;       /* PKL_GLOBAL */
    struct pkl_value *args;      /* PKL_TUPLE */
    struct pkl_value *kwargs;    /* PKL_DICT for NEWOBJ_EX, else NULL */
    struct pkl_value *state;     /* BUILD argument, NULL if never built */
    struct pkl_value *listitems; /* PKL_LIST from APPEND(S) on the object, or NULL */
    struct pkl_value *dictitems; /* PKL_DICT from SETITEM(S) on the object, or NULL */
};

struct pkl_value {
    uint8_t type;  /* enum pkl_type */
    uint8_t flags; /* PKL_F_* */
    uint8_t how;   /* PKL_HOW_* for objects */
    uint64_t pos;  /* byte offset of the opcode that created the value */
    union {
        int b;
        int64_t i;
        double f;
        struct {
            const char *s; /* NUL-terminated copy */
            size_t len;
        } str;
        struct {
            struct pkl_value **items;
            size_t len, cap;
        } seq;
        struct {
            const char *module, *name;
        } global;
        struct pkl_object *obj;
        const struct pkl_fold *fold;
    } u;
};

struct pkl_limits {
    size_t max_input;      /* bytes of pickle accepted (default 1 GiB) */
    size_t max_memory;     /* bytes the value graph may use (default 4 GiB) */
    size_t max_stack;      /* values on the stack at once (default 65536) */
    size_t max_marks;      /* open MARKs at once (default 1024) */
    size_t max_memo;       /* memo entries (default 256M; the memo's array counts in max_memory) */
    size_t max_container;  /* items in one list/tuple/dict/set (default 64M) */
    size_t max_long_bytes; /* LONG1/LONG4 payload bytes (default 1024) */
    size_t max_global_len; /* bytes of a GLOBAL module or name (default 1024) */
    size_t max_globals;    /* distinct GLOBALs (default 4096) */
    int min_protocol;      /* lowest protocol accepted (default 2: PROTO required) */
    int allow_trailing;    /* accept bytes after STOP (default 1, like CPython) */
};

/* Decide whether GLOBAL module.name may appear; return non-zero to allow.
 * Called once per distinct (module, name). */
typedef int (*pkl_global_filter)(void *arg, const char *module, const char *name);

struct pkl_options {
    struct pkl_limits lim;
    pkl_global_filter filter; /* NULL = allow every GLOBAL (it is only data) */
    void *filter_arg;
    int fold; /* fold DCP records (PKL_FOLDED; default 0). Needs a prescan of
               * the input for BINGET targets; the memo then keeps only the
               * slots read back, so it uses less memory than max_memory's
               * accounting of the plain memo assumes */
};

/* Fill o with the defaults above and no filter. */
void pkl_options_default(struct pkl_options *o);

struct pkl_doc {
    struct pkl_value *root;
    int protocol;        /* PROTO argument, 0 if none */
    size_t end;          /* offset just past STOP */
    size_t nvalues;      /* values allocated (without folding: folded ones count
                          * as the values they stand for) */
    size_t nfolded;      /* PKL_FOLDED records */
    uint64_t opcodes[4]; /* bitset of opcode bytes seen */
    size_t nglobals;
    const char **global_module; /* distinct GLOBALs in first-use order */
    const char **global_name;
    struct arena arena; /* owns every value and string */
};

/* Parse buf[0..len). On success *out owns the document (free with
 * pkl_free) and 0 is returned. On failure returns a CKPT_E* code (or
 * -ENOMEM), *out is NULL and err (if non-NULL) holds the position and
 * message. opt may be NULL for defaults. buf is not referenced afterwards. */
int pkl_parse(const void *buf, size_t len, const struct pkl_options *opt, struct pkl_doc **out,
              struct ckpt_err *err);

/* Release a document and every value in it; NULL is fine. */
void pkl_free(struct pkl_doc *doc);

/* Name of an opcode byte ("SHORT_BINUNICODE"), or NULL if undefined. */
const char *pkl_opcode_name(unsigned op);

/* Helpers for walking values (all NULL-safe). */
int pkl_is_global(const struct pkl_value *v, const char *module, const char *name);
/* For an object: its class reference; for a global: itself; else NULL. */
const struct pkl_value *pkl_class_of(const struct pkl_value *v);
/* Value for str key in a dict (first match, linear), or NULL. */
const struct pkl_value *pkl_dict_get(const struct pkl_value *dict, const char *key);
/* Human-readable, Python-like rendering of v into buf (always
 * NUL-terminated, truncated with "..."), walking at most max_depth levels
 * and max_nodes values; shared values are printed each time they are met. */
void pkl_repr(const struct pkl_value *v, char *buf, size_t buflen, size_t max_depth,
              size_t max_nodes);
const char *pkl_type_name(int type);

#endif
