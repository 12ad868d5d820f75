"""tests/integration/test_admin.py - ckptfs-admin against the shared fixtures.

Run:  /usr/bin/python3 -m pytest tests/integration/test_admin.py
Env:  CKPTFS_ADMIN    the binary (default build/tools/admin/ckptfs-admin)
      CKPTFS_FIXTURES the fixture tree (default <repo>/../shared/fixtures)

* every dcp-stub, dcp-torch1.13 and safetensors fixture: `dump --json` equals
  the parse-result fields of its .expected.json (and the stub-only fields
  pickle_protocol, metadata_class/fields, globals, opcodes, size, sha256;
  writer_style where the file shows it)
* every malformed/MANIFEST entry: the expected outcome, a JSON error with a
  known code, no crash and no sanitizer report
* ls / where / inspect / verify / index on the fixtures
* a real 4-rank torch 1.13 DCP checkpoint saved here: the bytes at each
  `where` offset torch.load to the saved tensor
"""
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

import harness

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
os.environ.setdefault("CKPTFS_TOOLS_LIB", os.path.join(REPO, "tools", "lib"))  # for SAVE_SCRIPT
ADMIN = harness.admin_bin()
FIX = os.environ.get("CKPTFS_FIXTURES", os.path.join(os.path.dirname(REPO), "shared", "fixtures"))

EX_OK, EX_CHECK, EX_USAGE, EX_PARSE, EX_IO, EX_DB, EX_NOTFOUND = 0, 1, 2, 3, 4, 5, 6

if not os.path.exists(ADMIN):
    pytest.skip("ckptfs-admin not built at %s (set CKPTFS_ADMIN)" % ADMIN, allow_module_level=True)


def run(*args, ok=(EX_OK,), env=None):
    p = subprocess.run([ADMIN] + [str(a) for a in args], capture_output=True, text=True,
                       errors="surrogateescape", timeout=120, env=env)  # stderr: raw path bytes
    assert p.returncode >= 0, "killed by signal %d: %s" % (-p.returncode, p.stderr)
    assert "Sanitizer" not in p.stderr and "runtime error" not in p.stderr, p.stderr
    assert p.returncode in ok, "exit %d for %s\nstdout: %s\nstderr: %s" % (
        p.returncode, args, p.stdout[-2000:], p.stderr[-2000:])
    return p


def run_json(*args, ok=(EX_OK,), env=None):
    p = run(*args, "--json", ok=ok, env=env)
    return p.returncode, json.loads(p.stdout)


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def subset(expected, got, path="$"):
    """Every key of expected (recursively) equals the same key in got."""
    if isinstance(expected, dict):
        assert isinstance(got, dict), "%s: want object, got %r" % (path, got)
        for k, v in expected.items():
            assert k in got, "%s: missing key %r" % (path, k)
            subset(v, got[k], "%s.%s" % (path, k))
    elif isinstance(expected, list):
        assert isinstance(got, list), "%s: want list, got %r" % (path, got)
        assert len(expected) == len(got), "%s: %d items, want %d" % (path, len(got), len(expected))
        for i, (a, b) in enumerate(zip(expected, got)):
            subset(a, b, "%s[%d]" % (path, i))
    else:
        assert expected == got, "%s: got %r, want %r" % (path, got, expected)


def fixtures(sub, suffix):
    d = os.path.join(FIX, sub)
    return sorted(f for f in os.listdir(d) if f.endswith(suffix)) if os.path.isdir(d) else []


# ---------------------------------------------------------------------------
# dcp-stub: every fixture, every field
# ---------------------------------------------------------------------------
STUB_FIELDS = ["pickle_protocol", "metadata_class", "metadata_fields", "globals", "opcodes",
               "size", "sha256", "tensors", "bytes", "storage", "planner_data"]


@pytest.mark.parametrize("name", fixtures("dcp-stub", ".metadata"))
def test_dcp_stub(name):
    exp = load(os.path.join(FIX, "dcp-stub", name[:-len(".metadata")] + ".expected.json"))
    _, got = run_json("dump", os.path.join(FIX, "dcp-stub", name))
    assert got["format"] == "dcp"
    for k in STUB_FIELDS:
        subset(exp[k], got[k], k)
    for k in ("storage_meta", "version"):       # present exactly for the layouts that have them
        assert (k in exp) == (k in got), k
        if k in exp:
            subset(exp[k], got[k], k)
    for k, v in got["writer_style"].items():    # what the file shows must match the writer
        if v is not None:
            assert exp["writer_style"][k] == v, ("writer_style", k)


# ---------------------------------------------------------------------------
# real torch 1.13 checkpoints
# ---------------------------------------------------------------------------
REAL_IGNORE = {"item_format", "zip_records", "tensor", "python_value"}


@pytest.mark.parametrize("name", ["per_item", "per_rank"])
def test_dcp_real(name):
    exp = load(os.path.join(FIX, "dcp-torch1.13", name + ".expected.json"))
    _, got = run_json("dump", "--hash", os.path.join(FIX, "dcp-torch1.13", name))
    for k in ("pickle_protocol", "metadata_class", "globals", "opcodes", "planner_data",
              "tensors", "bytes"):
        subset(exp[k], got[k], k)
    subset([{k: v for k, v in e.items() if k not in REAL_IGNORE} for e in exp["storage"]],
           got["storage"], "storage")
    files = dict(exp["files"])
    meta = files.pop(".metadata")
    assert got["size"] == meta["size"] and got["sha256"] == meta["sha256"]
    subset(files, got["files"], "files")
    assert len(files) == len(got["files"])
    # where: every chunk's item range is the one the expected storage gives
    for t in exp["tensors"][:3]:
        _, w = run_json("where", os.path.join(FIX, "dcp-torch1.13", name), t["fqn"])
        want = [(s["relative_path"], s["offset"], s["length"], s["chunk_offset"])
                for s in exp["storage"] if s["fqn"] == t["fqn"]]
        have = [(c["file"], c["offset"], c["length"], c["offsets"]) for c in w["chunks"]]
        assert sorted(have) == sorted(want)


# ---------------------------------------------------------------------------
# safetensors
# ---------------------------------------------------------------------------
def st_fixtures():
    out = []
    for dp, _, fns in os.walk(os.path.join(FIX, "safetensors")):
        out += [os.path.relpath(os.path.join(dp, f), FIX) for f in fns if f.endswith(".safetensors")]
    return sorted(out)


@pytest.mark.parametrize("rel", st_fixtures())
def test_safetensors(rel):
    exp = load(os.path.join(FIX, rel[:-len(".safetensors")] + ".expected.json"))
    _, got = run_json("dump", os.path.join(FIX, rel))
    assert got["format"] == "safetensors"
    for k, v in exp.items():
        if k in ("fixture", "global_shape"):
            continue
        subset(v, got[k], k)
    if "global_shape" in exp:
        _, d = run_json("dump", os.path.dirname(os.path.join(FIX, rel)))
        subset(exp["global_shape"], d["global_shape"], "global_shape")


def test_hf_index():
    d = os.path.join(FIX, "safetensors", "hf-dcp")
    index = load(os.path.join(d, "model.safetensors.index.json"))
    _, got = run_json("dump", d)
    assert set(got["files"]) == set(index["weight_map"].values())
    for fqn, f in index["weight_map"].items():
        assert fqn in [t["name"] for t in got["files"][f]["tensors"]]
    assert sum(t["nbytes"] for f in got["files"].values() for t in f["tensors"]) == \
        index["metadata"]["total_size"]
    _, ls = run_json("ls", os.path.join(d, "model.safetensors.index.json"))
    assert sorted(t["fqn"] for t in ls["tensors"]) == sorted(index["weight_map"])
    run("verify", d)


# ---------------------------------------------------------------------------
# malformed inputs
# ---------------------------------------------------------------------------
def manifest():
    rows = []
    with open(os.path.join(FIX, "malformed", "MANIFEST"), encoding="utf-8") as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            name, expect, desc = line.rstrip("\n").split("\t")
            rows.append((name, expect, desc))
    return rows


ERROR_CODES = {"ETRUNC", "EOPCODE", "ESTACK", "EMEMO", "ELIMIT", "ETYPE", "EGLOBAL",
               "EENCODING", "EFORMAT", "EINVALID"}


@pytest.mark.parametrize("name,expect,desc", manifest(), ids=[r[0] for r in manifest()])
def test_malformed(name, expect, desc):
    path = os.path.join(FIX, "malformed", name)
    if name.endswith("/"):
        code, got = run_json("verify", path, ok=(EX_CHECK,))
        assert got["ok"] is False and got["problems"], got
        return
    accept = expect in ("accept-or-reject", "reject-or-last-wins")
    code, got = run_json("dump", path, ok=(EX_PARSE, EX_OK) if accept else (EX_PARSE,))
    if code == EX_PARSE:
        err = got["error"]
        assert err["code"] in ERROR_CODES, err
        assert err["message"], err


def test_malformed_positions():
    """Errors in the pickle layer name the byte offset of the bad opcode."""
    cases = {"pkl_bad_opcode_ff.metadata": None, "pkl_proto_6.metadata": 0,
             "pkl_append_underflow.metadata": 2, "pkl_binunicode_huge.metadata": 2,
             "pkl_tuple3_underflow.metadata": 4, "pkl_build_on_int.metadata": 5}
    for name, pos in cases.items():
        _, got = run_json("dump", os.path.join(FIX, "malformed", name), ok=(EX_PARSE,))
        if pos is None:
            data = open(os.path.join(FIX, "malformed", name), "rb").read()
            pos = data.index(b"\xff")
        assert got["error"]["pos"] == pos, (name, got)
        assert "byte %d" % pos in got["error"]["message"]


# ---------------------------------------------------------------------------
# verbs
# ---------------------------------------------------------------------------
def test_ls_where_stub():
    p = os.path.join(FIX, "dcp-stub", "torch2.9+.p4.metadata")
    _, ls = run_json("ls", p)
    assert len(ls["tensors"]) == 12 and len(ls["bytes"]) == 2
    _, w = run_json("where", p, "model.big.weight")
    assert [c["length"] for c in w["chunks"]] == [2147484416, 2147484416]
    assert w["shape"] == [65536, 16384]
    run("where", p, "no.such.tensor", ok=(EX_NOTFOUND,))
    out = run("ls", p).stdout
    assert "model.ünïcødé.λ.weight" in out


def test_inspect_ranks():
    # torch 1.13 saves replicated tensors on rank 0 only: nobody is flagged
    _, j = run_json("inspect", os.path.join(FIX, "dcp-torch1.13", "per_rank"))
    assert j["world_size"] == 2 and j["flagged_ranks"] == 0
    assert all(f["in_save_order"] for f in j["files"])
    assert {r["fqn"] for r in j["replicated"]} >= {"model.tok_count", "model.mask"}
    # 2.x stubs spread replicated tensors over ranks: ranks 1..3 read others' files
    _, j = run_json("inspect", os.path.join(FIX, "dcp-stub", "torch2.4-2.6.p4.metadata"))
    assert j["world_size"] == 4
    flagged = [r["rank"] for r in j["ranks"] if r["flagged"]]
    assert flagged == [0, 1, 2, 3], j["ranks"]
    assert "__3_0.distcp" in j["ranks"][1]["foreign"]


def test_inspect_a_sparse_rank_number_does_not_blow_up():
    # one file named __999999999_0.distcp: the per-rank view would be a
    # billion ranks (it hung, growing without bound); it is left out instead
    _, j = run_json("inspect", os.path.join(REPO, "tests", "data", "sparse-rank"))
    assert j["world_size"] is None and j["nfiles"] == 4, j


def test_verify_real_ok():
    for name in ("per_item", "per_rank"):
        _, j = run_json("verify", os.path.join(FIX, "dcp-torch1.13", name))
        assert j["ok"] and j["unindexed_bytes"] == 0


def test_usage_errors():
    run(ok=(EX_USAGE,))
    run("frobnicate", ok=(EX_USAGE,))
    run("ls", ok=(EX_USAGE,))
    run("ls", "/nonexistent/ckpt", ok=(EX_IO,))
    assert "exit codes" in run("--help").stdout


def test_usage_errors_with_json():
    # with --json anywhere on the line, a usage error is also a JSON error
    # document on stdout (stdout was empty); exit 2 either way, and without
    # --json stdout stays empty
    p = os.path.join(FIX, "dcp-torch1.13", "per_rank")
    cases = [(), ("frobnicate",), ("ls",), ("index",), ("index", "frob"),
             ("index", "at", p, "f", "0", "--next", "x"), ("index", "at", p, "f", "0", "--next=-1"),
             ("index", "at", p, "f", "nan"), ("ls", p, "--no-such-option"), ("ls", p, "--cache-dir"),
             ("stats", p, "--watch", "0"), ("index", "bench", p, "--lookups", 10 ** 12)]
    for args in cases:
        for where in ("first", "last"):
            line = ("--json",) + args if where == "first" else args + ("--json",)
            if args[-1:] == ("--cache-dir",) and where == "last":
                continue   # "--json" would be the cache dir
            p_json = run(*line, ok=(EX_USAGE,))
            j = json.loads(p_json.stdout)
            err = j["error"]
            assert err["code"] == "EUSAGE" and err["message"], (line, j)
            assert err["message"] in p_json.stderr, (line, j, p_json.stderr)
        p_plain = run(*args, ok=(EX_USAGE,))
        assert p_plain.stdout == "" and p_plain.stderr, args


def test_json_names_that_are_not_utf8(tmp_path):
    # a path whose bytes are not UTF-8 (b"ck\xff"): every --json output is
    # still one JSON document, the bad byte shown as U+FFFD (it was empty, exit 0)
    store = tmp_path / "s"
    bad = store / "ck\udcff"           # os.fsencode: b"ck\xff"
    shutil.copytree(os.path.join(FIX, "dcp-torch1.13", "per_rank"), bad)
    shutil.copytree(os.path.join(FIX, "dcp-torch1.13", "per_rank"), store / "ok")
    shown = os.path.realpath(store) + "/ck\ufffd"
    for verb in ("ls", "inspect", "verify"):
        _, j = run_json(verb, bad)
        assert j["checkpoint"] == shown, (verb, j)
    _, j = run_json("dump", bad)
    assert j["tensors"], j
    _, j = run_json("where", bad, "model.embed.weight")
    assert j["chunks"], j
    _, j = run_json("where", bad, "no.such", ok=(EX_NOTFOUND,))
    assert j["error"]["what"] == shown, j
    cache = str(tmp_path / "cache")
    _, rep = run_json("index", "rebuild", store, "--cache-dir", cache)
    assert rep["indexed"] == 2 and len(rep["checkpoints"]) == 2, rep
    assert shown in [c["key"] for c in rep["checkpoints"]], rep
    _, ls = run_json("index", "ls", "--cache-dir", cache)
    assert sorted(c["key"] for c in ls["checkpoints"]) == [shown, shown[:-3] + "ok"], ls
    _, f = run_json("index", "files", bad, "--cache-dir", cache)
    assert f["checkpoint"] == shown and len(f["files"]) == 2, f
    _, a = run_json("index", "at", bad, "__0_0.distcp", 0, "--cache-dir", cache)
    assert a["checkpoint"] == shown, a
    _, w = run_json("index", "where", bad, "model.embed.weight", "--cache-dir", cache)
    assert w["chunks"], w


def test_dump_keeps_pickle_strings_json_cannot_carry(tmp_path):
    # strs in the pickle holding an encoded surrogate (Python's surrogatepass
    # writes U+D800 as ED A0 80), which Jansson refuses: dump succeeds and
    # keeps every field, each bad byte shown as U+FFFD (a key failed the
    # parse through planner_data, exit 3; checkpoint_id and version were left
    # out of the output)
    stub = os.path.join(FIX, "dcp-stub")
    key = open(os.path.join(stub, "torch2.9+.p4.metadata"), "rb").read()
    key = key.replace(b"\x8c\x10model.big.weight", b"\x8c\x10model.\xed\xa0\x80.weight")
    meta = open(os.path.join(stub, "torch2.9+.p4.str-checkpoint-id.metadata"), "rb").read()
    meta = meta.replace(b"\x8c\x19s3://bucket/ckpt/step_100", b"\x8c\x19s3://bucket/ckpt/\xed\xa0\x80p_100")
    meta = meta.replace(b"\x8c\x051.0.0", b"\x8c\x051\xed\xa0\x800")
    (tmp_path / "key.metadata").write_bytes(key)
    (tmp_path / "meta.metadata").write_bytes(meta)
    shown = "model.\ufffd\ufffd\ufffd.weight"
    _, j = run_json("dump", tmp_path / "key.metadata")
    assert shown in [t["fqn"] for t in j["tensors"]], j["tensors"]
    assert shown in [s["fqn"] for s in j["storage"]]
    assert shown in j["planner_data"], j["planner_data"]
    _, ls = run_json("ls", tmp_path / "key.metadata")
    assert shown in [t["fqn"] for t in ls["tensors"]]
    run_json("inspect", tmp_path / "key.metadata")
    _, j = run_json("dump", tmp_path / "meta.metadata")
    assert j["storage_meta"]["checkpoint_id"] == "s3://bucket/ckpt/\ufffd\ufffd\ufffdp_100", j
    assert j["version"] == "1\ufffd\ufffd\ufffd0", j


def test_json_errors_opening_the_source(tmp_path):
    # a path or URL that cannot be opened, a cache dir that cannot be made:
    # one JSON error document on stdout (stdout was empty)
    afile = tmp_path / "afile"
    afile.write_text("")
    p = os.path.join(FIX, "dcp-stub", "torch2.9+.p4.metadata")
    cases = [(("ls", "/nonexistent/ckpt"), EX_IO, "/nonexistent/ckpt"),
             (("verify", "s3://ab"), EX_IO, "s3://ab"),
             (("index", "rebuild", p, "--cache-dir", tmp_path / "c"), EX_USAGE,
              os.path.realpath(p)),  # the path it resolved (FIX may lead through a symlink)
             (("index", "rebuild", tmp_path, "--cache-dir", afile / "sub"), EX_IO,
              str(afile / "sub"))]
    for args, ex, what in cases:
        _, j = run_json(*args, ok=(ex,))
        assert j["error"]["what"] == what and j["error"]["message"], (args, j)


def test_a_folder_that_is_no_checkpoint_is_named_once(tmp_path):
    # the error names the folder the user gave, and says what is missing
    (tmp_path / "sub").mkdir()
    p = run("ls", tmp_path, ok=(EX_IO,))
    assert p.stderr.strip() == ("ckptfs-admin: %s: holds no .metadata, model.safetensors.index.json"
                                " or *.safetensors: not a checkpoint directory" % tmp_path), p.stderr
    _, j = run_json("verify", tmp_path, ok=(EX_IO,))
    assert j["error"]["code"] == "ENOTCKPT" and j["error"]["what"] == str(tmp_path), j
    assert "'.'" not in j["error"]["message"] and "not a checkpoint" in j["error"]["message"], j


def test_a_missing_index_says_how_to_build_one(tmp_path):
    # index ls/at before any rebuild: exit 5 and the way out, the path named once
    for args in (("index", "ls"), ("index", "at", tmp_path, "__0_0.distcp", "0")):
        p = run(*args, "--cache-dir", tmp_path / "c", ok=(EX_DB,))
        where = str(tmp_path / "c" / "index")
        assert p.stderr.count(where) == 1 and "ckptfs-admin index rebuild" in p.stderr, p.stderr


def test_options_take_values_with_equals(tmp_path):
    # every option with a value takes "--opt VALUE" and "--opt=VALUE", like the
    # mount's getopt_long (only --cache-dir= and --watch= did: exit 2)
    p = os.path.join(FIX, "dcp-torch1.13", "per_rank")
    cache = "--cache-dir=%s" % (tmp_path / "cache")
    run("ls", p, "--endpoint-url=http://127.0.0.1:1", "--region=eu-west-1", "--profile=x")
    run("index", "rebuild", p, cache, "-q")
    _, a = run_json("index", "at", p, "__0_0.distcp", 0, "--next=2", cache)
    assert len(a["next"]) == 2, a
    _, b = run_json("index", "bench", p, "--lookups=1000", cache)
    assert b["lookups"] == 1000 and b["wrong_answers"] == 0, b
    run("stats", tmp_path, "--watch=1", "--count=1", ok=(EX_IO,))   # not a mount: not exit 2
    for bad in ("--next=", "--next=x", "--count=-1", "--json=1"):
        run("ls", p, bad, ok=(EX_USAGE,))


def test_version_matches_the_mount_daemon():
    import harness  # (as below: the harness is imported where a test needs it)
    admin = run("--version").stdout.strip()
    daemon = subprocess.run([harness.ckptfs_bin(), "--version"], capture_output=True, text=True)
    assert daemon.returncode == 0, daemon
    assert re.fullmatch(r"ckptfs-admin \d+\.\d+\.\d+", admin), admin
    assert admin.split()[1] == daemon.stdout.split()[1], (admin, daemon.stdout)


# ---------------------------------------------------------------------------
# index rebuild / queries
# ---------------------------------------------------------------------------
def index_state(cache, key):
    """Everything the index answers for one checkpoint, minus ids/build times."""
    _, ls = run_json("index", "ls", "--cache-dir", cache)
    entry = [c for c in ls["checkpoints"] if c["key"] == key]
    assert len(entry) == 1, ls
    entry = {k: v for k, v in entry[0].items() if k not in ("id", "built_at")}
    _, files = run_json("index", "files", key, "--cache-dir", cache)
    hits = []
    for f in files["files"]:
        for off in range(0, f["size"] or 0, max(1, (f["size"] or 1) // 7)):
            code, j = run_json("index", "at", key, f["name"], off, "--next", 2,
                               "--cache-dir", cache, ok=(EX_OK, EX_NOTFOUND))
            hits.append((f["name"], off, j.get("item"), j.get("next")))
    return entry, files["files"], hits


def test_index_rebuild(tmp_path):
    store = tmp_path / "store"
    cache = str(tmp_path / "cache")
    shutil.copytree(os.path.join(FIX, "dcp-torch1.13"), store / "runs" / "a")
    shutil.copytree(os.path.join(FIX, "safetensors", "hf-dcp"), store / "hf")
    (store / "empty" / "deeper").mkdir(parents=True)
    code, rep = run_json("index", "rebuild", store, "--cache-dir", cache)
    assert rep["indexed"] == 3 and rep["failed"] == 0, rep
    keys = sorted(c["key"] for c in rep["checkpoints"])
    root = os.path.realpath(store)
    assert keys == [root + "/hf", root + "/runs/a/per_item", root + "/runs/a/per_rank"]
    key = root + "/runs/a/per_rank"
    before = index_state(cache, key)
    # the index answers like the checkpoint itself
    _, w = run_json("index", "where", key, "model.embed.weight", "--cache-dir", cache)
    _, w2 = run_json("where", key, "model.embed.weight")
    assert [(c["file"], c["offset"], c["length"]) for c in w["chunks"]] == \
        [(c["file"], c["offset"], c["length"]) for c in w2["chunks"]]
    # idempotent
    run_json("index", "rebuild", store, "--cache-dir", cache)
    assert index_state(cache, key) == before
    # a broken checkpoint fails alone (exit 1), the rest is indexed; a
    # removed one is forgotten
    bad = store / "broken"
    bad.mkdir()
    shutil.copy(os.path.join(FIX, "malformed", "pkl_truncated_half.metadata"), bad / ".metadata")
    shutil.rmtree(store / "runs" / "a" / "per_item")
    code, rep = run_json("index", "rebuild", store, "--cache-dir", cache, ok=(EX_CHECK,))
    assert rep["failed"] == 1 and rep["indexed"] == 2 and rep["removed"] == 1, rep
    failed = [c for c in rep["checkpoints"] if c["status"] == "failed"]
    assert failed[0]["key"].endswith("/broken") and failed[0]["exit"] == EX_PARSE
    assert "byte" in failed[0]["error"]
    assert index_state(cache, key) == before
    # offsets that no item holds, files and checkpoints the index lacks
    run("index", "at", key, "__0_0.distcp", 10 ** 12, "--cache-dir", cache, ok=(EX_NOTFOUND,))
    run("index", "at", key, "nope.distcp", 0, "--cache-dir", cache, ok=(EX_NOTFOUND,))
    run("index", "files", str(tmp_path), "--cache-dir", cache, ok=(EX_NOTFOUND,))
    # progress goes to stderr
    p = run("index", "rebuild", store, "--cache-dir", cache, ok=(EX_CHECK,))
    assert "[1/3]" in p.stderr and "FAILED" in p.stderr
    # a checkpoint still there that fails to load this time (a truncated
    # .metadata, a transient error) is not a stale entry: it stays indexed
    (store / "hf" / "model.safetensors.index.json").write_text("{")
    code, rep = run_json("index", "rebuild", store, "--cache-dir", cache, ok=(EX_CHECK,))
    assert rep["failed"] >= 2 and rep["removed"] == 0, rep
    _, ls = run_json("index", "ls", "--cache-dir", cache)
    assert root + "/hf" in [c["key"] for c in ls["checkpoints"]], ls
    # offsets are decimal (or 0x...), never octal, and never wrap
    _, a = run_json("index", "at", key, "__0_0.distcp", "010", "--cache-dir", cache)
    assert a["at"] == 10, a
    _, a = run_json("index", "at", key, "__0_0.distcp", "0x10", "--cache-dir", cache)
    assert a["at"] == 16, a
    run("index", "at", key, "__0_0.distcp", "9" * 23, "--cache-dir", cache, ok=(EX_USAGE,))


def test_index_version_mismatch(tmp_path):
    cache = str(tmp_path / "cache")
    store = tmp_path / "s"
    shutil.copytree(os.path.join(FIX, "dcp-torch1.13", "per_rank"), store / "c")
    run("index", "rebuild", store, "--cache-dir", cache, "-q")
    # set the schema record to 999 with the LMDB command-line tools
    if not shutil.which("mdb_dump") or not shutil.which("mdb_load"):
        pytest.skip("needs mdb_dump/mdb_load (lmdb-utils)")
    env = os.path.join(cache, "index")
    dump = subprocess.run(["mdb_dump", "-s", "meta", env], capture_output=True, text=True,
                          check=True).stdout
    lines = dump.splitlines()
    i = lines.index(" 736368656d61")          # key "schema"
    lines[i + 1] = " e7030000"                 # value 999 (u32 little-endian)
    subprocess.run(["mdb_load", "-s", "meta", env], input="\n".join(lines) + "\n", text=True,
                   check=True)
    code, j = run_json("index", "ls", "--cache-dir", cache, ok=(EX_DB,))
    assert j["error"]["code"] == "EVERSION" and "999" in j["error"]["message"]
    # rebuild replaces an index of another schema
    run("index", "rebuild", store, "--cache-dir", cache, "-q")
    _, j = run_json("index", "ls", "--cache-dir", cache)
    assert len(j["checkpoints"]) == 1


# ---------------------------------------------------------------------------
# a real torch 1.13 checkpoint, 4 ranks
# ---------------------------------------------------------------------------
SAVE_SCRIPT = textwrap.dedent(r'''
    import datetime, os, socket, sys

    # torch 1.13's _shard imports fail on Python 3.11: importing the workload module
    # installs the in-memory fix (see tools/lib/dcp_workload.py)
    sys.path.insert(0, os.environ["CKPTFS_TOOLS_LIB"])
    import dcp_workload  # noqa: F401

    WORLD = 4
    SHARDED = [("model.w_rows", (13, 8), "float32", 0),
               ("model.w_cols", (6, 12), "bfloat16", 1)]
    REPLICATED = [("model.bias", (5,), "float16"), ("model.count", (3,), "int64")]

    def full(torch, shape, dt):
        n = 1
        for s in shape:
            n *= s
        base = torch.arange(n, dtype=torch.float64)
        if dt == "int64":
            return (base * 7 - 3).to(torch.int64).reshape(shape)
        return ((base % 251) * 0.25 - 31.0).to(getattr(torch, dt)).reshape(shape)

    def worker(rank, port, path):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        import torch
        import torch.distributed as dist
        from torch.distributed._shard import sharded_tensor
        from torch.distributed._shard.sharding_spec import ChunkShardingSpec
        from torch.distributed._shard.checkpoint import FileSystemWriter, save_state_dict
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                                world_size=WORLD, timeout=datetime.timedelta(seconds=60))
        sd = {}
        for fqn, shape, dt, dim in SHARDED:
            spec = ChunkShardingSpec(dim=dim, placements=["rank:%d/cpu" % r for r in range(WORLD)])
            st = sharded_tensor.empty(spec, *shape, dtype=getattr(torch, dt))
            f = full(torch, shape, dt)
            for sh in st.local_shards():
                v = f
                for d, (o, n) in enumerate(zip(sh.metadata.shard_offsets, sh.metadata.shard_sizes)):
                    v = v.narrow(d, o, n)
                sh.tensor.copy_(v)
            sd[fqn] = st
        for fqn, shape, dt in REPLICATED:
            sd[fqn] = full(torch, shape, dt)
        sd["optim.step"] = 11
        for p, per_rank in ((path + "/per_rank", True), (path + "/per_item", False)):
            save_state_dict(sd, FileSystemWriter(p, single_file_per_rank=per_rank))
            dist.barrier()
        dist.destroy_process_group()

    if __name__ == "__main__":
        import multiprocessing as mp
        s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
        path = sys.argv[1]
        ctx = mp.get_context("spawn")
        ps = [ctx.Process(target=worker, args=(r, port, path)) for r in range(WORLD)]
        for p in ps:
            p.start()
        for p in ps:
            p.join(120)
            assert p.exitcode == 0, p.exitcode
''')


def torch_available():
    p = subprocess.run(["/usr/bin/python3", "-c", "import torch"], capture_output=True)
    return p.returncode == 0


@pytest.mark.skipif(not os.path.exists("/usr/bin/python3") or not torch_available(),
                    reason="needs /usr/bin/python3 with torch 1.13")
def test_real_torch_where(tmp_path, s3server, mounter):
    """4 ranks save with torch 1.13 (single_file_per_rank True and False) to local
    disk; the bytes at every `where` range torch.load to the saved chunk, read from
    the local directory and, after an upload to s3rver, through a ckptfs mount (the
    admin then runs on the mount path)."""
    import harness
    script = tmp_path / "save.py"
    script.write_text(SAVE_SCRIPT)
    subprocess.run(["/usr/bin/python3", str(script), str(tmp_path / "ckpt")], check=True,
                   timeout=180, cwd=str(tmp_path))
    for layout in ("per_rank", "per_item"):
        check_real(tmp_path, tmp_path / "ckpt" / layout)
    store = harness.S3Store(s3server, harness.unique_prefix("admin-mount"))
    items = []
    for layout in ("per_rank", "per_item"):
        d = tmp_path / "ckpt" / layout
        items += [(f"{layout}/{f}", str(d / f)) for f in os.listdir(d)]
    store.put_many(items)
    m = mounter(store)
    for layout in ("per_rank", "per_item"):
        check_real(tmp_path, m.p(layout))
    st = m.stats()
    assert st["get_bytes"] > 0 and st["errors"] == 0


def check_real(tmp_path, ckpt):
    # check in a torch process: every chunk's bytes torch.load to the saved values
    check = tmp_path / "check.py"
    check.write_text(SAVE_SCRIPT.split("if __name__")[0] + textwrap.dedent(r'''
        import io, json, subprocess
        import torch
        admin, ckpt = sys.argv[1], sys.argv[2]
        ls = json.loads(subprocess.check_output([admin, "ls", ckpt, "--json"]))
        want = {f: (s, d) for f, s, d, _ in SHARDED}
        want.update({f: (s, d) for f, s, d in REPLICATED})
        assert sorted(t["fqn"] for t in ls["tensors"]) == sorted(want), ls
        assert [b["fqn"] for b in ls["bytes"]] == ["optim.step"]
        n = 0
        for fqn, (shape, dt) in want.items():
            w = json.loads(subprocess.check_output([admin, "where", ckpt, fqn, "--json"]))
            assert w["shape"] == list(shape) and w["dtype"] == dt, w
            ref = full(torch, shape, dt)
            covered = 0
            for c in w["chunks"]:
                with open(os.path.join(ckpt, c["file"]), "rb") as f:
                    f.seek(c["offset"])
                    blob = f.read(c["length"])
                got = torch.load(io.BytesIO(blob))
                exp = ref
                for d, (o, s) in enumerate(zip(c["offsets"], c["sizes"])):
                    exp = exp.narrow(d, o, s)
                assert got.dtype == exp.dtype and torch.equal(got, exp), (fqn, c)
                covered += got.numel()
                n += 1
            assert covered == ref.numel(), fqn
        w = json.loads(subprocess.check_output([admin, "where", ckpt, "optim.step", "--json"]))
        with open(os.path.join(ckpt, w["file"]), "rb") as f:
            f.seek(w["offset"])
            assert torch.load(io.BytesIO(f.read(w["length"]))) == 11
        print("chunks", n)
    '''))
    out = subprocess.run(["/usr/bin/python3", str(check), os.path.abspath(ADMIN), str(ckpt)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "chunks 10" in out.stdout
    _, v = run_json("verify", ckpt)
    assert v["ok"], v
    _, j = run_json("inspect", ckpt)
    assert j["world_size"] == 4
    assert j["flagged_ranks"] == 0      # 1.13: replicated tensors on rank 0 only
    assert all(f["in_save_order"] for f in j["files"])


def test_shared_memo_is_not_quadratic(tmp_path):
    """20000 tensors sharing one 20000-chunk list through the memo (1.5 MB of
    pickle, 4e8 chunks if expanded) are refused at once, not expanded."""
    sys.path.insert(0, FIX)
    import make_fixtures as mf
    L = mf.LAYOUT_BY_KEY["torch2.4-2.6"]
    S = mf.make_stubs(L)
    chunks = [S.Chunk(offsets=mf.Size((i,)), sizes=mf.Size((1,))) for i in range(20000)]
    props = S.TP(dtype=mf.DTYPES["float32"])
    sdm = {"t%d" % i: S.TSM(properties=props, size=mf.Size((20000,)), chunks=chunks)
           for i in range(20000)}
    md = S.MD(state_dict_metadata=sdm, planner_data=None, storage_data={}, storage_meta=None)
    with mf.installed(S):
        data = mf.pickle.dumps(md, protocol=4)
    p = tmp_path / "shared.metadata"
    p.write_bytes(data)
    import time
    t0 = time.time()
    _, j = run_json("dump", p, ok=(EX_PARSE,))
    assert j["error"]["code"] == "ELIMIT"
    assert time.time() - t0 < 10


def test_index_bench_bounds_and_cleanup(tmp_path):
    """--lookups is bounded (2**60 overflowed the target array's size and
    crashed); the bench: entry is dropped on every way out (one with nothing
    to look up stayed in the user's index)."""
    p = os.path.join(FIX, "dcp-torch1.13", "per_rank")
    cache = str(tmp_path / "cache")
    run("index", "bench", p, "--lookups", 2 ** 60, "--cache-dir", cache, ok=(EX_USAGE,))
    run("index", "bench", p, "--lookups", 10 ** 8 + 1, "--cache-dir", cache, ok=(EX_USAGE,))
    sys.path.insert(0, FIX)
    import make_fixtures as mf
    S = mf.make_stubs(mf.LAYOUT_BY_KEY["torch2.4-2.6"])
    md = S.MD(state_dict_metadata={}, planner_data=None, storage_data={}, storage_meta=None)
    with mf.installed(S):
        data = mf.pickle.dumps(md, protocol=4)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / ".metadata").write_bytes(data)
    _, j = run_json("index", "bench", tmp_path / "empty", "--cache-dir", cache,
                    ok=(EX_NOTFOUND,))
    assert j["error"]["message"] == "nothing to look up", j
    _, b = run_json("index", "bench", p, "--lookups", 1000, "--cache-dir", cache)
    assert b["lookups"] == 1000 and b["wrong_answers"] == 0, b
    _, ls = run_json("index", "ls", "--cache-dir", cache)
    assert ls["checkpoints"] == [], ls


# ---------------------------------------------------------------------------
# the same checkpoints on s3rver: same answers, same index
# ---------------------------------------------------------------------------
def index_summary(cache, root, env=None, args=()):
    """Per checkpoint (by key relative to root): counts, files, and the item at
    a spread of offsets of every file, from the index."""
    _, ls = run_json("index", "ls", "--cache-dir", cache)
    out = {}
    for c in ls["checkpoints"]:
        if not c["key"].startswith(root + "/"):
            continue
        rel = c["key"][len(root) + 1:]
        _, files = run_json("index", "files", c["key"], "--cache-dir", cache, *args, env=env)
        hits = []
        for f in files["files"]:
            size = f["size"] or 0
            for off in sorted({0, size // 3, size // 2, max(0, size - 1), size}):
                _, j = run_json("index", "at", c["key"], f["name"], off, "--next", 3,
                                "--cache-dir", cache, *args, ok=(EX_OK, EX_NOTFOUND), env=env)
                hits.append((f["name"], off, j.get("item"), j.get("next")))
        out[rel] = ({k: c[k] for k in ("format", "files", "tensors", "items", "bytes")},
                    files["files"], hits)
    return out


@pytest.mark.s3only
@pytest.mark.skipif("s3" not in os.environ.get("CKPTFS_IT_STORES", "s3,dir").split(","),
                    reason="S3 store not selected")
def test_s3_matches_local(tmp_path, s3server):
    import harness
    store = harness.S3Store(s3server, harness.unique_prefix("admin-s3"))
    local = tmp_path / "local"
    shutil.copytree(os.path.join(FIX, "dcp-torch1.13"), local / "runs")
    shutil.copytree(os.path.join(FIX, "safetensors", "hf-dcp"), local / "hf")
    items = []
    for dp, _, fns in os.walk(local):
        for fn in fns:
            if fn.endswith(".json") and dp == str(local / "runs"):
                continue            # the expected JSON files are not part of a checkpoint
            p = os.path.join(dp, fn)
            items.append((os.path.relpath(p, local), p))
    # s3rver 3.7.1 reports a CommonPrefix only if some object sits directly
    # below it (a prefix holding only sub-prefixes is not listed; real S3 lists
    # it): give runs/ an object of its own so the walk can see it
    items.append(("runs/README", os.path.join(FIX, "README.md")))
    store.put_many(items)
    env = {**os.environ, **store.mount_env()}
    s3 = store.mount_args()
    # per-checkpoint views agree
    for rel in ("runs/per_rank", "runs/per_item", "hf"):
        for verb in (("ls",), ("inspect",), ("verify",), ("dump", "--hash")):
            _, a = run_json(*verb, local / rel)
            _, b = run_json(*verb, store.url + "/" + rel, *s3, env=env)
            for j in (a, b):
                j.pop("checkpoint", None)
                j.pop("source", None)
            assert a == b, (rel, verb)
    _, a = run_json("where", local / "runs/per_rank", "model.embed.weight")
    _, b = run_json("where", store.url + "/runs/per_rank/.metadata", "model.embed.weight", *s3,
                    env=env)
    assert a == b
    # index rebuild on the s3:// URL and on the local directory: the same index
    cl, cs = str(tmp_path / "cache-local"), str(tmp_path / "cache-s3")
    _, rl = run_json("index", "rebuild", local, "--cache-dir", cl)
    _, rs = run_json("index", "rebuild", store.url, *s3, "--cache-dir", cs, env=env)
    assert rl["indexed"] == rs["indexed"] == 3 and rs["failed"] == 0, rs
    sl = index_summary(cl, os.path.realpath(local))
    ss = index_summary(cs, store.url, env=env, args=s3)
    assert sl == ss
    assert len(sl) == 3
