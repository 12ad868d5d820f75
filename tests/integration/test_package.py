"""Install and package: `cmake --install` puts the commands, man pages and docs in the
usual places; CPack's DEB generator builds a package that runs from a scratch root; the
man pages list the same options as the commands' --help."""

import glob
import os
import re
import subprocess

import pytest

import harness

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _build_dir():
    """The CMake build directory of the binary under test (BUILD/fs/ckptfs)."""
    d = os.path.dirname(os.path.dirname(os.path.abspath(harness.ckptfs_bin())))
    if not os.path.exists(os.path.join(d, "CPackConfig.cmake")):
        pytest.skip(f"{d} is not a CMake build directory of this tree")
    return d


def _admin_bin():
    return os.environ.get("CKPTFS_ADMIN") or os.path.join(_build_dir(), "tools", "admin", "ckptfs-admin")


def _section(roff, name):
    """The text of one .SH section of a man page."""
    m = re.search(r"^\.SH " + name + r"\n(.*?)(?=^\.SH |\Z)", roff, re.S | re.M)
    assert m, f"no {name} section"
    return m.group(1)


def _long_options(text):
    text = re.sub(r"\\f[BIRP]", " ", text).replace("\\-", "-")  # roff fonts and dashes
    return set(re.findall(r"(?<![\w-])--([a-z][a-z-]*[a-z])", text))


def test_ckptfs_man_page_lists_the_options_of_help():
    help_text = subprocess.run([harness.ckptfs_bin(), "--help"], capture_output=True,
                               text=True, check=True).stdout
    with open(os.path.join(REPO, "docs", "man", "ckptfs.1")) as f:
        man = _section(f.read(), "OPTIONS")
    in_help, in_man = _long_options(help_text), _long_options(man)
    # --help shows -f, -d, -s and -o by their short names only; the man page gives both
    short_only = {"foreground", "debug", "single-thread", "options"}
    assert in_help - in_man == set(), "in --help, not in ckptfs.1"
    assert in_man - in_help == short_only, "in ckptfs.1, not in --help"
    for name in short_only:  # and those long names exist
        r = subprocess.run([harness.ckptfs_bin(), f"--{name}", "--help"], capture_output=True, text=True)
        assert "unknown option" not in r.stderr, (name, r.stderr)


def test_admin_man_page_lists_the_verbs_and_options_of_help():
    help_text = subprocess.run([_admin_bin(), "--help"], capture_output=True, text=True).stdout
    assert "verbs:" in help_text, help_text
    with open(os.path.join(REPO, "docs", "man", "ckptfs-admin.1")) as f:
        roff = f.read()
    verbs, options = _section(roff, "VERBS"), _section(roff, "OPTIONS")
    assert _long_options(help_text) == _long_options(verbs + options)
    verbs_help = help_text.split("verbs:")[1].split("options:")[0]
    in_help = set(re.findall(r"^  ([a-z]+(?: [a-z]+)?) [A-Z]", verbs_help, re.M)) | \
        set(re.findall(r"^  (index [a-z]+)\s*$", verbs_help, re.M)) | \
        set(re.findall(r"^  (index [a-z]+) ", verbs_help, re.M))
    in_man = set(re.findall(r"^\.B ([a-z]+(?: [a-z]+)?)(?: \\f| *$)", verbs, re.M))
    assert in_help, verbs_help
    assert in_help == in_man


def test_cmake_install_and_deb_package(tmp_path):
    build = _build_dir()
    # cmake --install into a prefix: commands, man pages, docs in the usual places
    prefix = tmp_path / "prefix"
    r = subprocess.run(["cmake", "--install", build, "--prefix", str(prefix)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    for rel in ["bin/ckptfs", "bin/ckptfs-admin", "share/man/man1/ckptfs.1.gz",
                "share/man/man1/ckptfs-admin.1.gz", "share/doc/ckptfs/README.md",
                "share/doc/ckptfs/semantics.md", "share/doc/ckptfs/operations.md"]:
        assert (prefix / rel).exists(), rel
    # cpack -G DEB, then unpack into a scratch root and run from there
    out = tmp_path / "pkg"
    r = subprocess.run(["cpack", "-G", "DEB", "-B", str(out)], cwd=build, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    debs = glob.glob(str(out / "ckptfs_*.deb"))
    assert len(debs) == 1, os.listdir(out)
    fields = subprocess.run(["dpkg-deb", "-f", debs[0], "Package", "Version", "Depends"],
                            capture_output=True, text=True, check=True).stdout
    for dep in ["fuse3", "libfuse3-3", "libcurl4", "liblmdb0", "libjansson4", "libxml2"]:
        assert dep in fields, fields
    root = tmp_path / "root"
    subprocess.run(["dpkg-deb", "-x", debs[0], str(root)], check=True)
    version = subprocess.run([str(root / "usr/bin/ckptfs"), "--version"], capture_output=True,
                             text=True, check=True).stdout.split()
    assert version[0] == "ckptfs" and f"Version: {version[1]}" in fields, (version, fields)
    admin = subprocess.run([str(root / "usr/bin/ckptfs-admin"), "--version"], capture_output=True,
                           text=True, check=True).stdout
    assert admin.split() == ["ckptfs-admin", version[1]]
    man = subprocess.run(["gzip", "-dc", str(root / "usr/share/man/man1/ckptfs.1.gz")],
                         capture_output=True, text=True, check=True).stdout
    assert man.startswith(".\\\"") and ".TH CKPTFS 1" in man
