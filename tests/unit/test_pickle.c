/*
 * tests/unit/test_pickle.c - the bounded pickle reader (index/pickle.c):
 * every opcode family, every limit, error codes and byte positions,
 * truncation at every length, memo sharing/cycles, iterative repr.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pickle.h"
#include "test_util.h"

#define P2 "\x80\x02"
#define P4 "\x80\x04"

static struct pkl_doc *doc;
static struct ckpt_err err;

static void teardown(void)
{
    pkl_free(doc);
    doc = NULL;
}

TestSuite(pickle, .fini = teardown);

static int parse_opt(const char *s, size_t n, const struct pkl_options *o)
{
    pkl_free(doc);
    doc = NULL;
    return pkl_parse(s, n, o, &doc, &err);
}

#define PARSE(lit) parse_opt(lit, sizeof(lit) - 1, NULL)

static int parse_p0(const char *s, size_t n)
{
    struct pkl_options o;
    pkl_options_default(&o);
    o.lim.min_protocol = 0;
    return parse_opt(s, n, &o);
}

#define PARSE0(lit) parse_p0(lit, sizeof(lit) - 1)

static const struct pkl_value *root(void)
{
    cr_assert_not_null(doc);
    return doc->root;
}

static const struct pkl_value *item(const struct pkl_value *v, size_t i)
{
    cr_assert(i < v->u.seq.len, "index %zu of %zu", i, v->u.seq.len);
    return v->u.seq.items[i];
}

/* ---- scalars --------------------------------------------------------- */

Test(pickle, ints)
{
    /* (BININT1 200, BININT2 65535, BININT -2, LONG1 0-len, LONG1 -1, LONG1 2**40) */
    cr_assert_eq(PARSE(P2 "(K\xc8M\xff\xffJ\xfe\xff\xff\xff\x8a\x00\x8a\x01\xff"
                          "\x8a\x06\x00\x00\x00\x00\x00\x01t."),
                 0, "%s", err.msg);
    const struct pkl_value *t = root();
    cr_assert_eq(t->type, PKL_TUPLE);
    cr_assert_eq(t->u.seq.len, 6);
    int64_t want[] = {200, 65535, -2, 0, -1, (int64_t)1 << 40};
    for (int i = 0; i < 6; i++) {
        cr_assert_eq(item(t, i)->type, PKL_INT);
        cr_assert_eq(item(t, i)->u.i, want[i], "item %d", i);
    }
}

Test(pickle, long_beyond_int64)
{
    /* 2**80 = 11 bytes; -2**63 fits; 2**63 does not */
    cr_assert_eq(PARSE(P2 "\x8a\x0b\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01."), 0);
    cr_assert_eq(root()->type, PKL_BIGINT);
    cr_assert_eq(root()->u.str.len, 11);
    cr_assert_eq(PARSE(P2 "\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80."), 0);
    cr_assert_eq(root()->type, PKL_INT);
    cr_assert_eq(root()->u.i, INT64_MIN);
    cr_assert_eq(PARSE(P2 "\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00."), 0);
    cr_assert_eq(root()->type, PKL_BIGINT);
    /* 9-byte encoding of -1 still fits */
    cr_assert_eq(PARSE(P2 "\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\xff."), 0);
    cr_assert_eq(root()->type, PKL_INT);
    cr_assert_eq(root()->u.i, -1);
    /* LONG4 */
    cr_assert_eq(PARSE(P2 "\x8b\x02\x00\x00\x00\x34\x12."), 0);
    cr_assert_eq(root()->u.i, 0x1234);
}

Test(pickle, float_none_bools)
{
    cr_assert_eq(PARSE(P2 "(G\x3f\xf8\x00\x00\x00\x00\x00\x00N\x88\x89t."), 0);
    const struct pkl_value *t = root();
    cr_assert_eq(item(t, 0)->type, PKL_FLOAT);
    cr_assert_float_eq(item(t, 0)->u.f, 1.5, 1e-12);
    cr_assert_eq(item(t, 1)->type, PKL_NONE);
    cr_assert_eq(item(t, 2)->type, PKL_BOOL);
    cr_assert_eq(item(t, 2)->u.b, 1);
    cr_assert_eq(item(t, 3)->u.b, 0);
}

Test(pickle, strings_and_bytes)
{
    cr_assert_eq(PARSE(P4 "(\x8c\x02hiX\x03\x00\x00\x00\xce\xbb!"
                          "\x8d\x01\x00\x00\x00\x00\x00\x00\x00z"
                          "C\x02\x00\x01"
                          "B\x01\x00\x00\x00\xff"
                          "\x8e\x00\x00\x00\x00\x00\x00\x00\x00"
                          "t."),
                 0, "%s", err.msg);
    const struct pkl_value *t = root();
    cr_assert_str_eq(item(t, 0)->u.str.s, "hi");
    cr_assert_str_eq(item(t, 1)->u.str.s, "\xce\xbb!");
    cr_assert_str_eq(item(t, 2)->u.str.s, "z");
    cr_assert_eq(item(t, 3)->type, PKL_BYTES);
    cr_assert_eq(item(t, 3)->u.str.len, 2);
    cr_assert_eq(item(t, 3)->u.str.s[1], 1);
    cr_assert_eq(item(t, 4)->u.str.len, 1);
    cr_assert_eq(item(t, 5)->u.str.len, 0);
    /* BYTEARRAY8 (protocol 5) is bytes flagged as bytearray */
    cr_assert_eq(PARSE("\x80\x05\x96\x01\x00\x00\x00\x00\x00\x00\x00x."), 0);
    cr_assert_eq(root()->type, PKL_BYTES);
    cr_assert(root()->flags & PKL_F_BYTEARRAY);
}

Test(pickle, utf8_rules)
{
    cr_assert_eq(PARSE(P2 "X\x02\x00\x00\x00\xc0\x80."), CKPT_EENCODING);         /* overlong */
    cr_assert_eq(PARSE(P2 "X\x01\x00\x00\x00\xe2."), CKPT_EENCODING);             /* cut sequence */
    cr_assert_eq(PARSE(P2 "X\x04\x00\x00\x00\xf4\x90\x80\x80."), CKPT_EENCODING); /* > U+10FFFF */
    /* a lone surrogate is accepted, like CPython's surrogatepass */
    cr_assert_eq(PARSE(P2 "X\x03\x00\x00\x00\xed\xa0\x80."), 0);
}

/* ---- containers ------------------------------------------------------ */

Test(pickle, lists_tuples_dicts)
{
    /* [1, 2, 3] via EMPTY_LIST APPEND + APPENDS; (,), tuples 1-3 */
    cr_assert_eq(PARSE(P2 "]K\x01"
                          "a(K\x02K\x03"
                          "e."),
                 0);
    cr_assert_eq(root()->type, PKL_LIST);
    cr_assert_eq(root()->u.seq.len, 3);
    cr_assert_eq(item(root(), 2)->u.i, 3);
    cr_assert_eq(PARSE(P2 "(K\x01\x85K\x01K\x02\x86K\x01K\x02K\x03\x87)t."), 0);
    cr_assert_eq(item(root(), 0)->u.seq.len, 1);
    cr_assert_eq(item(root(), 1)->u.seq.len, 2);
    cr_assert_eq(item(root(), 2)->u.seq.len, 3);
    cr_assert_eq(item(root(), 3)->u.seq.len, 0);
    /* LIST and DICT from a MARK */
    cr_assert_eq(PARSE0("(K\x01K\x02l."), 0);
    cr_assert_eq(root()->type, PKL_LIST);
    cr_assert_eq(PARSE0("(\x8c\x01"
                        "aK\x01\x8c\x01"
                        "bK\x02"
                        "d."),
                 0);
    cr_assert_eq(root()->type, PKL_DICT);
    cr_assert_eq(pkl_dict_get(root(), "b")->u.i, 2);
    /* SETITEM and SETITEMS keep order and duplicates as pairs */
    cr_assert_eq(PARSE(P2 "}\x8c\x01kK\x01s(\x8c\x01zK\x02\x8c\x01kK\x03u."), 0);
    cr_assert_eq(root()->u.seq.len, 6);
    cr_assert_str_eq(item(root(), 2)->u.str.s, "z");
    cr_assert_eq(pkl_dict_get(root(), "k")->u.i, 1); /* first match */
    /* tuples, ints and None are valid keys */
    cr_assert_eq(PARSE(P2 "}K\x01K\x02\x86Ns."), 0);
}

Test(pickle, sets)
{
    cr_assert_eq(PARSE(P4 "\x8f(K\x01K\x02\x90."), 0);
    cr_assert_eq(root()->type, PKL_SET);
    cr_assert_eq(root()->u.seq.len, 2);
    cr_assert_eq(PARSE(P4 "(K\x01\x91."), 0);
    cr_assert_eq(root()->type, PKL_FROZENSET);
    cr_assert_eq(PARSE(P4 "](K\x01\x90."), CKPT_ETYPE); /* ADDITEMS on a list */
}

Test(pickle, unhashable_keys)
{
    cr_assert_eq(PARSE(P2 "}]K\x01s."), CKPT_ETYPE);
    cr_assert_eq(err.pos, 6);
    cr_assert_eq(PARSE(P2 "}}K\x01s."), CKPT_ETYPE);
    cr_assert_eq(PARSE(P2 "}]\x85K\x01s."), CKPT_ETYPE); /* tuple holding a list */
    cr_assert_eq(PARSE("\x80\x05}\x96\x00\x00\x00\x00\x00\x00\x00\x00K\x01s."), CKPT_ETYPE);
}

Test(pickle, stack_ops)
{
    /* DUP then TUPLE2: the same value twice */
    cr_assert_eq(PARSE(P2 "]2\x86."), 0);
    cr_assert_eq(item(root(), 0), item(root(), 1));
    /* POP drops the top; POP_MARK drops to the mark */
    cr_assert_eq(PARSE(P2 "K\x01K\x02"
                          "0."),
                 0);
    cr_assert_eq(root()->u.i, 1);
    cr_assert_eq(PARSE(P2 "K\x07(K\x01K\x02"
                          "1."),
                 0);
    cr_assert_eq(root()->u.i, 7);
    /* POP with an empty region pops the MARK itself (CPython 3.x) */
    cr_assert_eq(PARSE(P2 "K\x07(0."), 0);
    cr_assert_eq(root()->u.i, 7);
}

Test(pickle, stack_misuse_positions)
{
    cr_assert_eq(PARSE(P2 "a."), CKPT_ESTACK);
    cr_assert_eq(err.pos, 2);
    cr_assert_eq(PARSE(P2 "K\x01\x87."), CKPT_ESTACK);
    cr_assert_eq(err.pos, 4);
    /* pops may not cross a MARK */
    cr_assert_eq(PARSE(P2 "K\x01(\x85."), CKPT_ESTACK);
    cr_assert_eq(err.pos, 5);
    cr_assert_eq(PARSE(P2 "}K\x01K\x02u."), CKPT_ESTACK); /* no MARK */
    cr_assert_eq(PARSE(P2 "1."), CKPT_ESTACK);
    cr_assert_eq(PARSE(P2 "0."), CKPT_ESTACK);
    cr_assert_eq(PARSE(P2 "2."), CKPT_ESTACK);
    cr_assert_eq(PARSE(P2 "(K\x01"
                          "e."),
                 CKPT_ESTACK);                        /* APPENDS without a target */
    cr_assert_eq(PARSE(P2 "}(K\x01u."), CKPT_ESTACK); /* odd SETITEMS */
    cr_assert_eq(PARSE0("(K\x01"
                        "d."),
                 CKPT_ESTACK);                          /* odd DICT */
    cr_assert_eq(PARSE(P2 "."), CKPT_ESTACK);           /* STOP, empty */
    cr_assert_eq(PARSE(P2 "K\x01K\x02."), CKPT_ESTACK); /* STOP, two values */
    cr_assert_eq(PARSE(P2 "K\x01(."), CKPT_ESTACK);     /* STOP, MARK open */
    cr_assert_eq(PARSE(P2 "K\x01]a."), CKPT_ETYPE);     /* APPEND to an int */
    cr_assert_eq(err.pos, 5);
    cr_assert_eq(PARSE(P2 "K\x01K\x01K\x02s."), CKPT_ETYPE); /* SETITEM on an int */
}

/* ---- memo ------------------------------------------------------------ */

Test(pickle, memo_shares_values)
{
    /* l = []; (l, l) via BINPUT/BINGET, then LONG_BINPUT/LONG_BINGET, MEMOIZE */
    cr_assert_eq(PARSE(P2 "]q\x00h\x00\x86."), 0);
    cr_assert_eq(item(root(), 0), item(root(), 1));
    cr_assert_eq(PARSE(P2 "]r\x05\x00\x00\x00j\x05\x00\x00\x00\x86."), 0);
    cr_assert_eq(item(root(), 0), item(root(), 1));
    cr_assert_eq(PARSE(P4 "]\x94}\x94h\x00\x87."), 0);
    cr_assert_eq(item(root(), 0)->type, PKL_LIST);
    cr_assert_eq(item(root(), 2)->type, PKL_LIST);
    cr_assert_eq(item(root(), 1)->type, PKL_DICT);
    /* mutation through the memo is seen by every holder (Python semantics) */
    cr_assert_eq(PARSE(P2 "]q\x00\x85h\x00K\x01"
                          "a0."),
                 0);
    cr_assert_eq(item(root(), 0)->u.seq.len, 1);
}

Test(pickle, memo_misuse)
{
    cr_assert_eq(PARSE(P2 "h\x05."), CKPT_EMEMO);
    cr_assert_eq(err.pos, 2);
    cr_assert_eq(PARSE(P2 "j\xff\xff\xff\xff."), CKPT_EMEMO);
    cr_assert_eq(PARSE(P2 "q\x00."), CKPT_ESTACK); /* BINPUT with an empty stack */
    /* a far-away LONG_BINPUT index is refused instead of allocating */
    cr_assert_eq(PARSE(P2 "Nr\x00\x00\x10\x00."), CKPT_EMEMO);
}

Test(pickle, self_reference_cycle)
{
    cr_assert_eq(PARSE(P2 "]q\x00h\x00"
                          "a."),
                 0);
    cr_assert_eq(item(root(), 0), root());
    char buf[256];
    pkl_repr(root(), buf, sizeof(buf), 5, 100);
    cr_assert(strstr(buf, "...") != NULL, "%s", buf);
}

/* ---- globals and objects ------------------------------------------- */

static int deny_evil(void *arg, const char *m, const char *n)
{
    (*(int *)arg)++;
    (void)n;
    return strcmp(m, "evil") != 0;
}

Test(pickle, globals)
{
    cr_assert_eq(PARSE(P2 "ctorch\nSize\n."), 0);
    cr_assert(pkl_is_global(root(), "torch", "Size"));
    cr_assert_eq(PARSE(P4 "\x8c\x05torch\x8c\x04Size\x93."), 0);
    cr_assert(pkl_is_global(root(), "torch", "Size"));
    /* distinct globals in first-use order, each once */
    cr_assert_eq(PARSE(P2 "(cb\nx\nca\ny\ncb\nx\nt."), 0);
    cr_assert_eq(doc->nglobals, 2);
    cr_assert_str_eq(doc->global_module[0], "b");
    cr_assert_str_eq(doc->global_name[1], "y");
    struct pkl_options o;
    pkl_options_default(&o);
    int calls = 0;
    o.filter = deny_evil;
    o.filter_arg = &calls;
    const char bad[] = P2 "(cok\nf\ncok\nf\ncevil\nf\nt.";
    cr_assert_eq(parse_opt(bad, sizeof(bad) - 1, &o), CKPT_EGLOBAL);
    cr_assert_eq(calls, 2, "filter called once per distinct global");
    cr_assert_eq(err.pos, 15);
    cr_assert(strstr(err.msg, "evil.f") != NULL, "%s", err.msg);
    cr_assert_eq(PARSE(P2 "ctorch\nSize"), CKPT_ETRUNC);
    cr_assert_eq(PARSE(P2 "c\nSize\n."), CKPT_EFORMAT);    /* empty module */
    cr_assert_eq(PARSE(P4 "K\x01K\x02\x93."), CKPT_ETYPE); /* STACK_GLOBAL ints */
}

Test(pickle, objects)
{
    /* REDUCE(torch.Size, ((2, 3),)) */
    cr_assert_eq(PARSE(P2 "ctorch\nSize\nK\x02K\x03\x86\x85R."), 0);
    const struct pkl_value *v = root();
    cr_assert_eq(v->type, PKL_OBJECT);
    cr_assert_eq(v->how, PKL_HOW_REDUCE);
    cr_assert(pkl_is_global(pkl_class_of(v), "torch", "Size"));
    cr_assert_eq(item(item(v->u.obj->args, 0), 1)->u.i, 3);
    /* NEWOBJ + BUILD(dict) */
    cr_assert_eq(PARSE(P2 "cm\nC\n)\x81}\x8c\x01xK\x05sb."), 0);
    v = root();
    cr_assert_eq(v->how, PKL_HOW_NEWOBJ);
    cr_assert_eq(pkl_dict_get(v->u.obj->state, "x")->u.i, 5);
    /* NEWOBJ_EX */
    cr_assert_eq(PARSE(P4 "cm\nC\n)}\x92."), 0);
    cr_assert_eq(root()->how, PKL_HOW_NEWOBJ_EX);
    cr_assert_not_null(root()->u.obj->kwargs);
    /* items set on an object are recorded, not executed */
    cr_assert_eq(PARSE(P2 "ccollections\nOrderedDict\n)R(\x8c\x01"
                          "aK\x01u."),
                 0);
    cr_assert_eq(root()->u.obj->dictitems->u.seq.len, 2);
    cr_assert_eq(PARSE(P2 "cm\nL\n)RK\x01"
                          "a."),
                 0);
    cr_assert_eq(root()->u.obj->listitems->u.seq.len, 1);
    /* wrong kinds */
    cr_assert_eq(PARSE(P2 "K\x01}b."), CKPT_ETYPE);
    cr_assert_eq(err.pos, 5);
    cr_assert_eq(PARSE(P2 "K\x01)R."), CKPT_ETYPE);
    cr_assert_eq(PARSE(P2 "K\x01)\x81."), CKPT_ETYPE);
    cr_assert_eq(PARSE(P2 "cm\nC\nK\x01R."), CKPT_ETYPE); /* args not a tuple */
    cr_assert_eq(PARSE(P2 "cm\nC\n}b."), CKPT_ETYPE);     /* BUILD on a class */
}

/* ---- protocol, frames, refused opcodes ------------------------------ */

Test(pickle, protocol_and_frames)
{
    cr_assert_eq(PARSE(P4 "\x95\x02\x00\x00\x00\x00\x00\x00\x00N."), 0);
    cr_assert_eq(doc->protocol, 4);
    cr_assert_eq(PARSE(P4 "\x95\xff\x00\x00\x00\x00\x00\x00\x00N."), CKPT_ETRUNC);
    cr_assert_eq(err.pos, 2);
    cr_assert_eq(PARSE("\x80\x06N."), CKPT_EOPCODE);
    cr_assert_eq(PARSE("N."), CKPT_EOPCODE); /* no PROTO: protocol 0/1 */
    cr_assert_eq(err.pos, 0);
    cr_assert_eq(PARSE0("N."), 0);
    struct pkl_options o;
    pkl_options_default(&o);
    o.lim.min_protocol = 4;
    cr_assert_eq(parse_opt(P2 "N.", 4, &o), CKPT_EOPCODE);
    cr_assert_eq(PARSE(""), CKPT_ETRUNC);
    cr_assert_eq(PARSE("\x80"), CKPT_ETRUNC);
    cr_assert_eq(PARSE(P2 "N"), CKPT_ETRUNC); /* no STOP */
}

Test(pickle, trailing_bytes)
{
    cr_assert_eq(PARSE(P2 "N.junk"), 0);
    cr_assert_eq(doc->end, 4);
    struct pkl_options o;
    pkl_options_default(&o);
    o.lim.allow_trailing = 0;
    cr_assert_eq(parse_opt(P2 "N.junk", 8, &o), CKPT_EFORMAT);
    cr_assert_eq(err.pos, 4);
}

Test(pickle, refused_opcodes)
{
    static const struct {
        const char *in;
        size_t n;
        int code;
    } cases[] = {
#define C(s, c) {s, sizeof(s) - 1, c}
        C("I1\n.", CKPT_EOPCODE),
        C("L1L\n.", CKPT_EOPCODE),
        C("S'a'\n.", CKPT_EOPCODE),
        C("Va\n.", CKPT_EOPCODE),
        C("F1.0\n.", CKPT_EOPCODE),
        C("Np0\n.", CKPT_EOPCODE),
        C("g0\n.", CKPT_EOPCODE),
        C("(im\nC\n.", CKPT_EOPCODE),
        C("(o.", CKPT_EOPCODE),
        C("T\x01\x00\x00\x00"
          "a.",
          CKPT_EOPCODE),
        C("U\x01"
          "a.",
          CKPT_EOPCODE),
        C("Pid\n.", CKPT_EOPCODE),
        C("NQ.", CKPT_EOPCODE),
        C("\x82\x01.", CKPT_EOPCODE),
        C("\x83\x01\x00.", CKPT_EOPCODE),
        C("\x84\x01\x00\x00\x00.", CKPT_EOPCODE),
        C("\x97.", CKPT_EOPCODE),
        C("N\x98.", CKPT_EOPCODE),
        C("\xff.", CKPT_EOPCODE),
        C("\x00.", CKPT_EOPCODE),
#undef C
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int rc = parse_p0(cases[i].in, cases[i].n);
        cr_assert_eq(rc, cases[i].code, "case %zu: rc %d (%s)", i, rc, err.msg);
        cr_assert_neq(err.pos, CKPT_NOPOS);
        cr_assert(strstr(err.msg, "byte ") != NULL, "%s", err.msg);
    }
}

Test(pickle, declared_lengths_beyond_input)
{
    cr_assert_eq(PARSE(P2 "X\xf0\xff\xff\xff"
                          "abc."),
                 CKPT_ETRUNC);
    cr_assert_eq(PARSE(P4 "\x8d\x00\x00\x00\x00\x00\x00\x00\x40"
                          "abc."),
                 CKPT_ETRUNC);
    cr_assert_eq(PARSE(P4 "\x8c\xc8"
                          "abc"),
                 CKPT_ETRUNC);
    cr_assert_eq(PARSE(P4 "\x8e\x00\x00\x00\x00\x00\x01\x00\x00x."), CKPT_ETRUNC);
    cr_assert_eq(PARSE(P2 "C\x05"
                          "ab"),
                 CKPT_ETRUNC);
    cr_assert_eq(PARSE(P2 "\x8b\xff\xff\xff\x7f\x01."), CKPT_ETRUNC);
    cr_assert_eq(PARSE(P2 "\x8b\xff\xff\xff\xff."), CKPT_EFORMAT); /* negative */
    cr_assert_eq(PARSE(P2 "\x8a\x05\x01"), CKPT_ETRUNC);
    cr_assert_eq(PARSE(P2 "J\x01\x00"), CKPT_ETRUNC);
    cr_assert_eq(PARSE(P2 "G\x00\x00"), CKPT_ETRUNC);
    cr_assert_eq(err.pos, 2);
}

/* ---- limits ---------------------------------------------------------- */

static int parse_lim(const char *s, size_t n, void (*set)(struct pkl_limits *))
{
    struct pkl_options o;
    pkl_options_default(&o);
    set(&o.lim);
    return parse_opt(s, n, &o);
}

static void lim_stack(struct pkl_limits *l)
{
    l->max_stack = 3;
}
static void lim_marks(struct pkl_limits *l)
{
    l->max_marks = 2;
}
static void lim_memo(struct pkl_limits *l)
{
    l->max_memo = 2;
}
static void lim_container(struct pkl_limits *l)
{
    l->max_container = 2;
}
static void lim_long(struct pkl_limits *l)
{
    l->max_long_bytes = 4;
}
static void lim_glen(struct pkl_limits *l)
{
    l->max_global_len = 3;
}
static void lim_globals(struct pkl_limits *l)
{
    l->max_globals = 1;
}
static void lim_input(struct pkl_limits *l)
{
    l->max_input = 4;
}
static void lim_memory(struct pkl_limits *l)
{
    l->max_memory = 64 * 1024;
}

#define LIM(lit, fn) parse_lim(lit, sizeof(lit) - 1, fn)

Test(pickle, limits)
{
    cr_assert_eq(LIM(P2 "NNN0.", lim_stack), CKPT_ESTACK); /* 3 fit, then 2 left: STOP fails */
    cr_assert_eq(LIM(P2 "NNNN.", lim_stack), CKPT_ELIMIT);
    cr_assert_eq(err.pos, 5);
    cr_assert_eq(LIM(P2 "((11(1N.", lim_marks), 0);
    cr_assert_eq(LIM(P2 "(((N.", lim_marks), CKPT_ELIMIT);
    cr_assert_eq(err.pos, 4);
    cr_assert_eq(LIM(P2 "Nq\x01.", lim_memo), 0);
    cr_assert_eq(LIM(P2 "Nq\x02.", lim_memo), CKPT_ELIMIT);
    cr_assert_eq(LIM(P2 "](NNe.", lim_container), 0);
    cr_assert_eq(LIM(P2 "](NNNe.", lim_container), CKPT_ELIMIT);
    cr_assert_eq(LIM(P2 "(NNNt.", lim_container), CKPT_ELIMIT);
    cr_assert_eq(LIM(P2 "\x8a\x04\x01\x02\x03\x04.", lim_long), 0);
    cr_assert_eq(LIM(P2 "\x8a\x05\x01\x02\x03\x04\x05.", lim_long), CKPT_ELIMIT);
    cr_assert_eq(LIM(P2 "cabc\nd\n.", lim_glen), 0);
    cr_assert_eq(LIM(P2 "cabcd\nd\n.", lim_glen), CKPT_ELIMIT);
    cr_assert_eq(LIM(P4 "\x8c\x04"
                        "abcd\x8c\x01x\x93.",
                     lim_glen),
                 CKPT_ELIMIT);
    cr_assert_eq(LIM(P2 "(ca\nb\nca\nb\nt.", lim_globals), 0);
    cr_assert_eq(LIM(P2 "(ca\nb\nca\nc\nt.", lim_globals), CKPT_ELIMIT);
    cr_assert_eq(LIM(P2 "N.", lim_input), 0);
    cr_assert_eq(LIM(P2 "NN0.", lim_input), CKPT_ELIMIT);
    cr_assert_eq(err.pos, 0);
}

Test(pickle, memory_limit)
{
    /* 4096 empty lists, each a value: more than 64 KiB of graph */
    size_t n = 4096;
    char *buf = malloc(2 + 2 * n + 2);
    memcpy(buf, P2, 2);
    size_t k = 2;
    buf[k++] = ']';
    for (size_t i = 0; i < n; i++) {
        buf[k++] = ']';
        buf[k++] = 'a';
    }
    buf[k++] = '.';
    cr_assert_eq(parse_lim(buf, k, lim_memory), CKPT_ELIMIT, "%s", err.msg);
    cr_assert_eq(parse_opt(buf, k, NULL), 0);
    free(buf);
}

Test(pickle, default_depth_limits)
{
    /* 100000 nested lists: stack limit, no recursion */
    size_t n = 100000;
    char *buf = malloc(2 + 2 * n + 1);
    memcpy(buf, P2, 2);
    memset(buf + 2, ']', n);
    memset(buf + 2 + n, 'a', n - 1);
    buf[2 + 2 * n - 1] = '.';
    cr_assert_eq(parse_opt(buf, 2 + 2 * n, NULL), CKPT_ELIMIT);
    /* the same depth through the memo needs no stack: accepted, and repr
     * and free stay iterative */
    size_t m = 0;
    char *b2 = malloc(16 * n);
    memcpy(b2,
           P4 "]\x94"
              "0",
           5);
    m = 5;
    for (size_t i = 0; i < n; i++) { /* push list, get previous, append, memoize, pop */
        b2[m++] = ']';
        b2[m++] = 'j';
        uint32_t idx = (uint32_t)i;
        memcpy(b2 + m, &idx, 4);
        m += 4;
        b2[m++] = 'a';
        b2[m++] = '\x94';
        b2[m++] = '0';
    }
    b2[m++] = 'j';
    uint32_t last = (uint32_t)n;
    memcpy(b2 + m, &last, 4);
    m += 4;
    b2[m++] = '.';
    cr_assert_eq(parse_opt(b2, m, NULL), 0, "%s", err.msg);
    char out[128];
    pkl_repr(root(), out, sizeof(out), 1000000, 1000000);
    cr_assert(strncmp(out, "[[[[", 4) == 0);
    free(buf);
    free(b2);
}

Test(pickle, dag_bomb_repr_is_bounded)
{
    /* 30 levels of 16 references each: 16**30 leaves if expanded */
    char buf[4096];
    size_t k = 0;
    memcpy(buf,
           P2 "X\x01\x00\x00\x00xq\x00"
              "0",
           11);
    k = 11;
    for (int lvl = 1; lvl < 30; lvl++) {
        buf[k++] = '(';
        for (int r = 0; r < 16; r++) {
            buf[k++] = 'h';
            buf[k++] = (char)(lvl - 1);
        }
        buf[k++] = 'l';
        buf[k++] = 'q';
        buf[k++] = (char)lvl;
        buf[k++] = '0';
    }
    buf[k++] = 'h';
    buf[k++] = 29;
    buf[k++] = '.';
    cr_assert_eq(parse_opt(buf, k, NULL), 0, "%s", err.msg);
    char out[4096];
    pkl_repr(root(), out, sizeof(out), 64, 10000);
    cr_assert(strlen(out) < sizeof(out));
}

/* ---- every truncation of a real metadata ------------------------------ */

Test(pickle, every_truncation_fails_cleanly)
{
    const char *names[] = {"torch2.9+.p2.metadata", "torch2.9+.p4.metadata",
                           "torch1.13.p3.metadata"};
    for (size_t f = 0; f < 3; f++) {
        char path[512];
        snprintf(path, sizeof(path), "%s/dcp-stub/%s", CKPTFS_FIXTURES, names[f]);
        size_t n;
        char *b = slurp(path, &n);
        cr_assert_eq(parse_opt(b, n, NULL), 0, "%s: %s", names[f], err.msg);
        for (size_t cut = 0; cut < n; cut++) {
            char *copy = malloc(cut ? cut : 1); /* exact size: ASan catches overreads */
            memcpy(copy, b, cut);
            int rc = parse_opt(copy, cut, NULL);
            free(copy);
            cr_assert(rc < 0, "%s cut at %zu parsed", names[f], cut);
            cr_assert(err.pos <= cut, "%s cut %zu: pos %llu", names[f], cut,
                      (unsigned long long)err.pos);
        }
        free(b);
    }
}

Test(pickle, opcode_names)
{
    cr_assert_str_eq(pkl_opcode_name(0x8c), "SHORT_BINUNICODE");
    cr_assert_str_eq(pkl_opcode_name('('), "MARK");
    cr_assert_null(pkl_opcode_name(0xff));
}
