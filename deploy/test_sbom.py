"""Tests of deploy/sbom.py: the ELF section reader, the dependency-list parser and the CycloneDX
document, with well-formed, malformed, oversized and hostile input; and the OCI archive digest.

    python3 -m unittest deploy/test_sbom.py        # from the repository's root
    (harness/e2e/tests/deploy/sbom.rs runs it under `cargo test`)
"""

import contextlib
import hashlib
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import unittest
import zlib
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True
sys.path.insert(0, HERE)
import sbom  # noqa: E402


# ---------------------------------------------------------------------------------------------
# Inputs made here: ELF files, dependency lists, OCI archives


def make_elf(sections, elf64=True, little=True, shentsize=None, shstrndx=None, shoff=None, shnum=None):
    """A minimal ELF file: the null section, `sections` ([(name, data, type, flags)] or
    [(name, data)]), the section name table last, then the section table."""
    end = "<" if little else ">"
    header = struct.Struct(end + ("HHIQQQIHHHHHH" if elf64 else "HHIIIIIHHHHHH"))
    section = struct.Struct(end + ("IIQQQQIIQQ" if elf64 else "IIIIIIIIII"))
    sections = [s if len(s) == 4 else (s[0], s[1], 1, 0) for s in sections]
    names = b"\0"
    name_offsets = []
    for name, *_ in sections + [(".shstrtab",)]:
        name_offsets.append(len(names))
        names += name.encode() + b"\0"
    body = b""
    start = 16 + header.size
    placed = []
    for (name, data, kind, flags), name_offset in zip(sections, name_offsets):
        placed.append((name_offset, kind, flags, start + len(body), len(data)))
        body += data
    placed.append((name_offsets[-1], 3, 0, start + len(body), len(names)))
    body += names
    table_offset = start + len(body)
    count = len(placed) + 1
    table = section.pack(*([0] * 10))
    for name_offset, kind, flags, offset, size in placed:
        table += section.pack(name_offset, kind, flags, 0, offset, size, 0, 0, 1, 0)
    ident = b"\x7fELF" + bytes([2 if elf64 else 1, 1 if little else 2, 1]) + b"\0" * 9
    head = header.pack(
        2, 62, 1, 0, 0,
        table_offset if shoff is None else shoff,
        0, 16 + header.size, 0, 0,
        section.size if shentsize is None else shentsize,
        count if shnum is None else shnum,
        count - 1 if shstrndx is None else shstrndx,
    )
    return ident + head + body + table


def pkg(name, version="1.0.0", source="crates.io", **extra):
    return dict(name=name, version=version, source=source, **extra)


def dep_list(packages, **extra):
    return json.dumps(dict(packages=packages, **extra)).encode()


def section_of(packages):
    return zlib.compress(dep_list(packages))


DAEMONS = [
    pkg("athenz-daemons", "0.2.0", "local", root=True, dependencies=[1, 2, 3]),
    pkg("tokio", "1.47.1", dependencies=[2]),
    pkg("libc", "0.2.175"),
    pkg("serde_derive", "1.0.219", kind="build"),
]
SIA = [
    pkg("athenz-sia", "0.2.0", "local", root=True, dependencies=[1, 2]),
    pkg("libc", "0.2.175"),
    pkg("serde_derive", "1.0.219"),  # a runtime package here: runtime wins
    pkg("semver-pre", "1.0.0-rc.1+build.5"),
]


def oci_archive(path, index=None, manifest=None, blob_name=None, extra=()):
    """An OCI archive: index.json naming one manifest stored under blobs/sha256/."""
    manifest = manifest if manifest is not None else json.dumps({
        "schemaVersion": 2, "mediaType": sbom.OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": "sha256:" + "0" * 64, "size": 2},
        "layers": [],
    }).encode()
    digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    if index is None:
        index = {"schemaVersion": 2, "manifests": [
            {"mediaType": sbom.OCI_MANIFEST, "digest": digest, "size": len(manifest)}]}
    raw_index = index if isinstance(index, bytes) else json.dumps(index).encode()
    with tarfile.open(path, "w") as tar:
        for name, data in [("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'),
                           ("index.json", raw_index),
                           (blob_name or "blobs/sha256/" + digest[7:], manifest), *extra]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return digest


def image_manifest(arch):
    """A platform's image manifest (its bytes): unique per architecture."""
    return json.dumps({
        "schemaVersion": 2, "mediaType": sbom.OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": "sha256:" + hashlib.sha256(arch.encode()).hexdigest(), "size": 2},
        "layers": [],
    }).encode()


def oci_index_archive(path, entries=None, arches=("amd64", "arm64"), blobs=None):
    """An OCI archive of an image index (as `buildah manifest push --all` writes it): index.json
    names the index, which lists `entries` (default: one image manifest per arch of `arches`,
    each stored under blobs/sha256/). Returns (the index's digest, {"linux/<arch>": digest})."""
    stored = dict(blobs or {})
    platforms = {}
    if entries is None:
        entries = []
        for arch in arches:
            manifest = image_manifest(arch)
            digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
            stored["blobs/sha256/" + digest[7:]] = manifest
            platforms[f"linux/{arch}"] = digest
            entries.append({"mediaType": sbom.OCI_MANIFEST, "digest": digest, "size": len(manifest),
                            "platform": {"architecture": arch, "os": "linux"}})
    index = json.dumps({"schemaVersion": 2, "mediaType": sbom.OCI_INDEX, "manifests": entries}).encode()
    digest = oci_archive(path, manifest=index, index={"schemaVersion": 2, "manifests": [
        {"mediaType": sbom.OCI_INDEX, "digest": "sha256:" + hashlib.sha256(index).hexdigest(),
         "size": len(index)}]}, extra=tuple(stored.items()))
    return digest, platforms


class Refused(unittest.TestCase):
    def refused(self, fn, *args, contains=()):
        with self.assertRaises(sbom.SbomError) as ctx:
            fn(*args)
        for text in contains:
            self.assertIn(text, str(ctx.exception))
        return str(ctx.exception)


# ---------------------------------------------------------------------------------------------


class ElfSection(Refused):
    def test_finds_the_section_in_64_and_32_bit_files_of_either_byte_order(self):
        payload = b"\x78\x9c payload"
        for elf64 in (True, False):
            for little in (True, False):
                data = make_elf([(".text", b"\x90" * 7), (".dep-v0", payload), (".data", b"x")], elf64, little)
                self.assertEqual(sbom.elf_section(data, ".dep-v0", "f"), payload, (elf64, little))

    def test_a_name_that_only_starts_alike_is_not_the_section(self):
        data = make_elf([(".dep-v0.old", b"a"), (".dep-v", b"b")])
        self.refused(sbom.elf_section, data, ".dep-v0", "bin/x", contains=("bin/x", "no .dep-v0 section"))

    def test_without_the_section_the_error_names_the_file(self):
        msg = self.refused(sbom.elf_section, make_elf([(".text", b"\x90")]), ".dep-v0", "/x/athenz-sia")
        self.assertTrue(msg.startswith("/x/athenz-sia: no .dep-v0 section"), msg)
        self.assertIn("cargo auditable", msg)

    def test_not_elf(self):
        for data in (b"", b"\x7fEL", b"MZ\x90\x00" + b"\0" * 100, b"#!/bin/sh\necho hi\n"):
            self.refused(sbom.elf_section, data, ".dep-v0", "f", contains=("f: not an ELF file",))

    def test_unknown_class_or_byte_order(self):
        good = make_elf([(".dep-v0", b"x")])
        self.refused(sbom.elf_section, good[:4] + b"\x03" + good[5:], ".dep-v0", "f", contains=("class",))
        self.refused(sbom.elf_section, good[:5] + b"\x00" + good[6:], ".dep-v0", "f", contains=("byte order",))

    def test_truncated_anywhere(self):
        data = make_elf([(".dep-v0", b"0123456789")])
        for cut in range(0, len(data)):
            with self.assertRaises(sbom.SbomError, msg=f"cut at {cut}"):
                sbom.elf_section(data[:cut], ".dep-v0", "f")

    def test_no_section_table(self):
        self.refused(sbom.elf_section, make_elf([(".dep-v0", b"x")], shoff=0), ".dep-v0", "f",
                     contains=("no section table",))

    def test_section_table_past_the_end(self):
        for shoff in (10**6, 2**64 - 1):
            self.refused(sbom.elf_section, make_elf([(".dep-v0", b"x")], shoff=shoff), ".dep-v0", "f")
        self.refused(sbom.elf_section, make_elf([(".dep-v0", b"x")], shnum=0xFEFF), ".dep-v0", "f",
                     contains=("past the end",))

    def test_wrong_section_header_size(self):
        for size in (0, 1, 40, 0xFFFF):
            self.refused(sbom.elf_section, make_elf([(".dep-v0", b"x")], shentsize=size), ".dep-v0", "f",
                         contains=("section header size",))

    def test_name_table_index_out_of_range(self):
        self.refused(sbom.elf_section, make_elf([(".dep-v0", b"x")], shstrndx=9), ".dep-v0", "f")
        # extended numbering: the index is in section 0's sh_link, which is 0 here (the null section)
        self.refused(sbom.elf_section, make_elf([(".dep-v0", b"x")], shstrndx=0xFFFF), ".dep-v0", "f")

    def test_extended_section_count(self):
        # e_shnum 0: the count is section 0's sh_size, which is 0 in make_elf's null section
        self.refused(sbom.elf_section, make_elf([(".dep-v0", b"x")], shnum=0), ".dep-v0", "f")

    def test_section_data_past_the_end(self):
        data = bytearray(make_elf([(".dep-v0", b"0123")]))
        shoff = struct.unpack_from("<Q", data, 16 + 24)[0]
        entry = shoff + 64  # section 1, .dep-v0
        for offset, size in ((0, 2**64 - 1), (2**64 - 2, 4), (len(data), 1), (len(data) - 1, 2)):
            struct.pack_into("<QQ", data, entry + 24, offset, size)
            self.refused(sbom.elf_section, bytes(data), ".dep-v0", "f", contains=("past the end",))

    def test_name_offset_outside_the_name_table(self):
        data = bytearray(make_elf([(".dep-v0", b"0123")]))
        shoff = struct.unpack_from("<Q", data, 16 + 24)[0]
        struct.pack_into("<I", data, shoff + 64, 0xFFFFFFFF)
        self.refused(sbom.elf_section, bytes(data), ".dep-v0", "f", contains=("name",))

    def test_unterminated_name_table(self):
        data = bytearray(make_elf([(".dep-v0", b"0123")]))
        shoff = struct.unpack_from("<Q", data, 16 + 24)[0]
        strtab = shoff + 2 * 64
        size = struct.unpack_from("<Q", data, strtab + 32)[0]
        struct.pack_into("<Q", data, strtab + 32, size - 1)  # drops the last NUL
        self.refused(sbom.elf_section, bytes(data), ".dep-v0", "f", contains=("not terminated",))

    def test_nobits_or_compressed_section(self):
        self.refused(sbom.elf_section, make_elf([(".dep-v0", b"x", 8, 0)]), ".dep-v0", "f",
                     contains=("no contents",))
        self.refused(sbom.elf_section, make_elf([(".dep-v0", b"x", 1, 0x800)]), ".dep-v0", "f",
                     contains=("compressed",))

    def test_two_sections_of_the_name(self):
        self.refused(sbom.elf_section, make_elf([(".dep-v0", b"a"), (".dep-v0", b"b")]), ".dep-v0", "f",
                     contains=("2 .dep-v0 sections",))

    def test_oversized_section(self):
        data = make_elf([(".dep-v0", b"x" * 100)])
        with mock.patch.object(sbom, "MAX_SECTION_BYTES", 99):
            self.refused(sbom.elf_section, data, ".dep-v0", "f", contains=("100 bytes",))

    @unittest.skipUnless(shutil.which("objcopy") and os.path.isfile("/bin/true"), "needs objcopy, /bin/true")
    def test_agrees_with_objcopy_on_a_toolchain_made_elf(self):
        payload = section_of(DAEMONS)
        with tempfile.TemporaryDirectory() as tmp:
            raw, binary, dumped = (os.path.join(tmp, n) for n in ("raw", "bin", "dumped"))
            with open(raw, "wb") as f:
                f.write(payload)
            subprocess.run(["objcopy", "--add-section", f".dep-v0={raw}", "/bin/true", binary], check=True)
            subprocess.run(["objcopy", "--dump-section", f".dep-v0={dumped}", binary, os.path.join(tmp, "copy")],
                           check=True)
            with open(binary, "rb") as f:
                found = sbom.elf_section(f.read(), ".dep-v0", binary)
            with open(dumped, "rb") as f:
                self.assertEqual(found, f.read())
            self.assertEqual(found, payload)
            self.assertEqual([p["name"] for p in sbom.binary_packages(binary)], [p["name"] for p in DAEMONS])
            self.refused(sbom.binary_packages, "/bin/true", contains=("/bin/true: no .dep-v0 section",))

    def test_real_binaries_when_built(self):
        """The image's binaries, when deploy/image.sh has built them (target/image/bin)."""
        directory = os.path.join(HERE, "..", "target", "image", "bin")
        names = ("athenz-daemons", "athenz-sia", "athenz-volume-driver")
        paths = [os.path.join(directory, n) for n in names]
        if not all(os.path.isfile(p) for p in paths):
            self.skipTest("no binaries in target/image/bin (deploy/image.sh builds them)")
        for path, name in zip(paths, names):
            packages = sbom.binary_packages(path)
            roots = [p["name"] for p in packages if p["root"]]
            self.assertEqual(roots, [name], path)


class Decompress(Refused):
    def test_round_trip(self):
        self.assertEqual(sbom.decompress(zlib.compress(b'{"a":1}'), "f"), b'{"a":1}')

    def test_not_zlib(self):
        for data in (b"", b"not zlib at all", b"\x78\x9c\xff\xff\xff", zlib.compress(b"x")[2:]):
            self.refused(sbom.decompress, data, "bin/x", contains=("bin/x",))

    def test_truncated_stream(self):
        data = zlib.compress(b"x" * 1000)
        self.refused(sbom.decompress, data[:-5], "f", contains=("truncated",))

    def test_data_after_the_stream(self):
        self.refused(sbom.decompress, zlib.compress(b"{}") + b"\0", "f", contains=("after its zlib stream",))

    def test_a_bomb_stops_at_the_cap(self):
        # 64 MiB of zeros in about 64 KiB: refused having inflated at most MAX_JSON_BYTES
        deflate = zlib.compressobj(9)
        chunk = b"\0" * (1 << 20)
        bomb = b"".join(deflate.compress(chunk) for _ in range(64)) + deflate.flush()
        self.assertLess(len(bomb), 1 << 20)
        self.refused(sbom.decompress, bomb, "f", contains=("decompresses to more than",))

    def test_cap_exact(self):
        with mock.patch.object(sbom, "MAX_JSON_BYTES", 100):
            self.assertEqual(len(sbom.decompress(zlib.compress(b"x" * 99), "f")), 99)
            self.refused(sbom.decompress, zlib.compress(b"x" * 100), "f")
            self.refused(sbom.decompress, zlib.compress(b"x" * 101), "f")


class ParsePackages(Refused):
    def parse(self, packages, **extra):
        return sbom.parse_packages(dep_list(packages, **extra), "bin/x")

    def wrong(self, packages, *contains, **extra):
        return self.refused(self.parse, packages, contains=("bin/x",) + contains, **extra)

    def test_well_formed(self):
        got = self.parse(DAEMONS, format=1)
        self.assertEqual([p["name"] for p in got], ["athenz-daemons", "tokio", "libc", "serde_derive"])
        self.assertEqual(got[0]["dependencies"], [1, 2, 3])
        self.assertTrue(got[0]["root"])
        self.assertEqual(got[2], {"name": "libc", "version": "0.2.175", "source": "crates.io",
                                  "kind": "runtime", "dependencies": [], "root": False})
        self.assertEqual(got[3]["kind"], "build")

    def test_unknown_fields_are_ignored(self):
        # rust-audit's own reader ignores them too: a later cargo-auditable may add some
        self.assertEqual(len(self.parse([pkg("a", features=["x"])], extra={"y": 1})), 1)

    def test_duplicate_dependency_indexes_collapse(self):
        self.assertEqual(self.parse([pkg("a", dependencies=[1, 1]), pkg("b")])[0]["dependencies"], [1])

    def test_not_utf8(self):
        self.refused(sbom.parse_packages, b'{"packages":[{"name":"\xff"}]}', "f", contains=("UTF-8",))

    def test_not_json(self):
        for text in (b"", b"{", b"packages", b'{"packages":[]}x', b"\0\0\0"):
            self.refused(sbom.parse_packages, text, "bin/x", contains=("bin/x", "not valid JSON"))

    def test_json_extensions_refused(self):
        for text in (b'{"packages":NaN}', b'{"packages":[{"name":"a","version":"1.0.0","source":"local",'
                                          b'"dependencies":[Infinity]}]}'):
            self.refused(sbom.parse_packages, text, "f", contains=("not valid JSON",))

    def test_duplicate_keys(self):
        text = b'{"packages":[{"name":"a","name":"b","version":"1.0.0","source":"local"}]}'
        self.refused(sbom.parse_packages, text, "f", contains=("duplicate key",))

    def test_deep_nesting(self):
        self.refused(sbom.parse_packages, b"[" * 200_000 + b"]" * 200_000, "f", contains=("f:",))
        self.refused(sbom.parse_packages, b'{"packages":' + b"[" * 200_000, "f")

    def test_huge_numbers(self):
        text = '{"packages":[{"name":"a","version":"1.0.0","source":"local","dependencies":[%s]}]}'
        for number in ("9" * 5000, "1e999", "-1", "0.0", "1.5"):
            self.refused(sbom.parse_packages, (text % number).encode(), "f")

    def test_wrong_shape(self):
        for doc in ([], "packages", None, 3, {}, {"packages": {}}, {"packages": "a"}, {"packages": None},
                    {"Packages": [pkg("a")]}, {"packages": []}, {"packages": [pkg("a")], "format": -1},
                    {"packages": [pkg("a")], "format": "1"}, {"packages": [pkg("a")], "format": True}):
            self.refused(sbom.parse_packages, json.dumps(doc).encode(), "bin/x",
                         contains=("bin/x", "not a cargo-auditable dependency list"))

    def test_package_not_an_object(self):
        for p in (None, [], "a", 1, True):
            self.wrong([p], "package 0 is not an object")

    def test_missing_or_mistyped_fields(self):
        for field in ("name", "version", "source"):
            p = pkg("a")
            del p[field]
            self.wrong([p], f"no {field} string")
            for value in (None, 1, [], {}, True):
                p[field] = value
                self.wrong([p], f"no {field} string")

    def test_hostile_strings(self):
        for name in ("", "../../etc/passwd", "a b", "a/b", "a@b", "-a", "a\0", "a\n", "ä", "a" * 129,
                     "<script>", "a?b=c", "a#b", "%2e%2e"):
            self.wrong([pkg(name)], "name")
        for version in ("", "1", "1.0", "01.0.0", "1.0.0 ", "1.0.0\n", "1.0.0;rm", "v1.0.0", "1.0.0-",
                        "1.0.0+", "1.0.0/../x", "1.0.0-" + "\u00e9", "1.0.0?x=y"):
            self.wrong([pkg("a", version)], "version")
        for source in ("", " ", "crates.io\n", "a b", "../x", "\u202ecrates.io", "x" * 300, "git+ssh://h/p?x"):
            self.wrong([pkg("a", source=source)], "source")

    def test_long_values_are_cut_in_the_message(self):
        msg = self.wrong([pkg("a", "9" * 10_000 + "x")], "version")
        self.assertLess(len(msg), 400)

    def test_kind_and_root(self):
        for kind in ("", "Runtime", "dev", None, 1, ["build"]):
            self.wrong([pkg("a", kind=kind)], "kind")
        for root in (1, 0, "true", None, []):
            self.wrong([pkg("a", root=root)], "root is not a boolean")

    def test_more_than_one_root(self):
        self.wrong([pkg("a", root=True), pkg("b", root=True)], "2 root packages")

    def test_dependencies_not_an_array(self):
        for deps in ({}, "0", 0, None, True):
            self.wrong([pkg("a", dependencies=deps), pkg("b")], "dependencies is not an array")

    def test_dependency_index_not_an_integer(self):
        for index in (True, False, 1.0, "1", None, [1], {"i": 1}):
            self.wrong([pkg("a", dependencies=[index]), pkg("b")], "not an integer")

    def test_dependency_index_out_of_range(self):
        for index in (2, 3, -1, -3, 2**63, 2**64 + 1, -(2**63)):
            msg = self.wrong([pkg("a", dependencies=[index]), pkg("b")], "out of range")
            self.assertIn(f"index {index}", msg)

    def test_cycles(self):
        self.wrong([pkg("a", dependencies=[0])], "cycle")
        self.wrong([pkg("a", root=True, dependencies=[1]), pkg("b", dependencies=[2]), pkg("c", dependencies=[1])],
                   "cycle through package 1 (b)")

    def test_a_long_chain_needs_no_recursion(self):
        n = 50_000
        chain = [pkg(f"p{i}", dependencies=[i + 1] if i + 1 < n else []) for i in range(n)]
        self.assertEqual(len(self.parse(chain)), n)

    def test_more_than_100000_packages(self):
        self.assertEqual(sbom.MAX_PACKAGES, 100_000)
        one = '{"name":"a","version":"1.0.0","source":"local"}'
        text = ('{"packages":[' + ",".join([one] * 100_001) + "]}").encode()
        self.refused(sbom.parse_packages, text, "bin/x", contains=("bin/x: 100001 packages (at most 100000)",))

    def test_100000_packages_are_accepted(self):
        one = '{"name":"a","version":"1.0.0","source":"local"}'
        text = ('{"packages":[' + ",".join([one] * 100_000) + "]}").encode()
        self.assertEqual(len(sbom.parse_packages(text, "f")), 100_000)

    def test_too_many_edges(self):
        with mock.patch.object(sbom, "MAX_DEPENDENCY_EDGES", 5):
            self.wrong([pkg("a", dependencies=[1] * 6), pkg("b")], "more than 5 dependency edges")
            self.assertEqual(self.parse([pkg("a", dependencies=[1] * 5), pkg("b")])[0]["dependencies"], [1])

    def test_oversized_text(self):
        with mock.patch.object(sbom, "MAX_JSON_BYTES", 10):
            self.refused(sbom.parse_packages, dep_list([pkg("a")]), "f", contains=("more than 10 bytes",))


class CycloneDx(Refused):
    DIGEST = "sha256:" + "ab" * 32

    def doc(self, **kw):
        binaries = [("bin/athenz-daemons", sbom.parse_packages(dep_list(DAEMONS))),
                    ("bin/athenz-sia", sbom.parse_packages(dep_list(SIA)))]
        return sbom.cyclonedx(binaries, "ghcr.io/o/athenz-k8s-identity", "0.2.0", **kw)

    def test_document(self):
        doc = self.doc(digest=self.DIGEST, timestamp="2025-01-02T03:04:05Z")
        self.assertEqual((doc["bomFormat"], doc["specVersion"], doc["version"]), ("CycloneDX", "1.5", 1))
        image = doc["metadata"]["component"]
        self.assertEqual((image["type"], image["name"], image["version"]),
                         ("container", "ghcr.io/o/athenz-k8s-identity", "0.2.0"))
        self.assertEqual(image["purl"], "pkg:oci/athenz-k8s-identity@sha256%3A" + "ab" * 32
                         + "?repository_url=ghcr.io/o/athenz-k8s-identity&tag=0.2.0")
        self.assertEqual(doc["metadata"]["timestamp"], "2025-01-02T03:04:05Z")
        json.dumps(doc, allow_nan=False)

    def test_one_component_per_name_and_version(self):
        components = self.doc()["components"]
        self.assertEqual([(c["name"], c["version"]) for c in components], [
            ("athenz-daemons", "0.2.0"), ("athenz-sia", "0.2.0"), ("libc", "0.2.175"),
            ("semver-pre", "1.0.0-rc.1+build.5"), ("serde_derive", "1.0.219"), ("tokio", "1.47.1")])
        refs = [c["bom-ref"] for c in components]
        self.assertEqual(len(set(refs)), len(refs))
        by_name = {c["name"]: c for c in components}
        self.assertEqual(by_name["libc"]["purl"], "pkg:cargo/libc@0.2.175")
        self.assertEqual(by_name["libc"]["bom-ref"], "pkg:cargo/libc@0.2.175")
        self.assertEqual(by_name["semver-pre"]["purl"], "pkg:cargo/semver-pre@1.0.0-rc.1%2Bbuild.5")
        self.assertNotIn("purl", by_name["athenz-daemons"])  # local: not on crates.io
        self.assertEqual(by_name["athenz-daemons"]["type"], "application")
        self.assertEqual(by_name["tokio"]["type"], "library")
        # build-only in one binary, runtime in the other: runtime
        self.assertEqual(by_name["serde_derive"]["scope"], "required")

    def test_build_only_packages_are_excluded(self):
        binaries = [("b", sbom.parse_packages(dep_list(DAEMONS)))]
        by_name = {c["name"]: c for c in sbom.cyclonedx(binaries, "i", "1")["components"]}
        self.assertEqual(by_name["serde_derive"]["scope"], "excluded")
        self.assertEqual(by_name["tokio"]["scope"], "required")

    def test_dependency_graph(self):
        doc = self.doc(digest=self.DIGEST)
        graph = {d["ref"]: d["dependsOn"] for d in doc["dependencies"]}
        image = doc["metadata"]["component"]["bom-ref"]
        self.assertEqual(graph[image], ["cargo:local/athenz-daemons@0.2.0", "cargo:local/athenz-sia@0.2.0"])
        self.assertEqual(graph["cargo:local/athenz-daemons@0.2.0"],
                         ["pkg:cargo/libc@0.2.175", "pkg:cargo/serde_derive@1.0.219", "pkg:cargo/tokio@1.47.1"])
        self.assertEqual(graph["pkg:cargo/tokio@1.47.1"], ["pkg:cargo/libc@0.2.175"])
        self.assertEqual(graph["pkg:cargo/libc@0.2.175"], [])
        known = {c["bom-ref"] for c in doc["components"]} | {image}
        self.assertEqual(set(graph), known)
        for refs in graph.values():
            self.assertLessEqual(set(refs), known)

    def test_one_name_and_version_from_two_sources(self):
        binaries = [("bin/a", sbom.parse_packages(dep_list([pkg("x", source="crates.io")]))),
                    ("bin/b", sbom.parse_packages(dep_list([pkg("x", source="git")])))]
        self.refused(sbom.cyclonedx, binaries, "i", "1", contains=("bin/b", "x 1.0.0"))

    def test_bad_digest(self):
        for digest in ("", "sha256:abc", "sha512:" + "a" * 64, "sha256:" + "A" * 64, "sha256:" + "a" * 64 + "\n"):
            self.refused(lambda: self.doc(digest=digest), contains=("digest",))

    def test_without_a_digest(self):
        image = self.doc()["metadata"]["component"]
        self.assertNotIn("purl", image)
        self.assertEqual(image["bom-ref"], "image:ghcr.io/o/athenz-k8s-identity:0.2.0")


class OciDigest(Refused):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.tmp.name, "image.oci.tar")

    def tearDown(self):
        self.tmp.cleanup()

    def test_digest(self):
        digest = oci_archive(self.path)
        self.assertEqual(sbom.oci_archive_digest(self.path), digest)

    def test_not_a_tar(self):
        with open(self.path, "wb") as f:
            f.write(b"not a tar" * 100)
        self.refused(sbom.oci_archive_digest, self.path, contains=(self.path,))
        self.refused(sbom.oci_archive_digest, os.path.join(self.tmp.name, "missing"), contains=("missing",))

    def test_no_index(self):
        with tarfile.open(self.path, "w"):
            pass
        self.refused(sbom.oci_archive_digest, self.path, contains=("no index.json",))

    def test_index_not_json_or_not_one_manifest(self):
        for index in (b"{", b"[]", {"manifests": []}, {"manifests": {}}, {"manifests": [1]}, {},
                      {"manifests": [{"digest": "sha256:" + "0" * 64}] * 2}):
            oci_archive(self.path, index=index)
            self.refused(sbom.oci_archive_digest, self.path)

    def test_hostile_digest(self):
        for digest in ("sha256:../../../../etc/passwd", "sha256:" + "0" * 63, "md5:" + "0" * 32, 1, None):
            oci_archive(self.path, index={"manifests": [{"mediaType": sbom.OCI_MANIFEST, "digest": digest}]})
            self.refused(sbom.oci_archive_digest, self.path, contains=("digest",))

    def test_not_an_oci_manifest(self):
        manifest = b"{}"
        digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
        oci_archive(self.path, manifest=manifest, index={"manifests": [
            {"mediaType": "application/vnd.docker.distribution.manifest.v2+json", "digest": digest, "size": 2}]})
        self.refused(sbom.oci_archive_digest, self.path, contains=("not an OCI image manifest",))

    def test_missing_or_altered_blob(self):
        oci_archive(self.path, blob_name="blobs/sha256/elsewhere")
        self.refused(sbom.oci_archive_digest, self.path, contains=("no blobs/sha256/",))
        manifest = b'{"schemaVersion":2}'
        digest = "sha256:" + hashlib.sha256(b"something else").hexdigest()
        oci_archive(self.path, manifest=manifest, index={"manifests": [
            {"mediaType": sbom.OCI_MANIFEST, "digest": digest, "size": len(manifest)}]},
            blob_name="blobs/sha256/" + digest[7:])
        self.refused(sbom.oci_archive_digest, self.path, contains=("do not hash to",))

    def test_size_mismatch(self):
        manifest = b'{"schemaVersion":2}'
        digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
        oci_archive(self.path, manifest=manifest, index={"manifests": [
            {"mediaType": sbom.OCI_MANIFEST, "digest": digest, "size": 3}]})
        self.refused(sbom.oci_archive_digest, self.path, contains=("its descriptor says 3",))

    def test_index_is_a_link(self):
        with tarfile.open(self.path, "w") as tar:
            info = tarfile.TarInfo("index.json")
            info.type = tarfile.SYMTYPE
            info.linkname = "/etc/passwd"
            tar.addfile(info)
        self.refused(sbom.oci_archive_digest, self.path, contains=("not a regular file",))

    def test_oversized_index(self):
        oci_archive(self.path, index=b" " * 2000)
        with mock.patch.object(sbom, "MAX_OCI_JSON_BYTES", 1000):
            self.refused(sbom.oci_archive_digest, self.path, contains=("2000 bytes",))


class OciIndex(Refused):
    """The release's archive: an image index with a manifest per platform."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.tmp.name, "index.oci.tar")

    def tearDown(self):
        self.tmp.cleanup()

    def test_digest_and_platforms(self):
        digest, platforms = oci_index_archive(self.path)
        self.assertEqual(sbom.oci_archive_digest(self.path), digest)
        self.assertEqual(sbom.oci_archive_platforms(self.path), platforms)
        self.assertEqual(sorted(platforms), ["linux/amd64", "linux/arm64"])
        self.assertNotEqual(platforms["linux/amd64"], platforms["linux/arm64"])

    def test_one_image_has_no_platforms(self):
        oci_archive(self.path)
        self.refused(sbom.oci_archive_platforms, self.path, contains=("not an index",))

    def entry(self, arch="arm64", **changes):
        manifest = image_manifest(arch)
        entry = {"mediaType": sbom.OCI_MANIFEST, "digest": "sha256:" + hashlib.sha256(manifest).hexdigest(),
                 "size": len(manifest), "platform": {"architecture": arch, "os": "linux"}}
        entry.update(changes)
        return entry, {"blobs/sha256/" + entry["digest"][7:]: manifest} if isinstance(entry["digest"], str) \
            and sbom.DIGEST_RE.match(entry["digest"]) else {}

    def test_malformed_and_hostile_indexes(self):
        good, blobs = self.entry()
        cases = {
            "no manifest": ([], "lists no manifest"),
            "not a list": ({"a": 1}, "lists no manifest"),
            "no platform": ([{**good, "platform": None}], "names no platform"),
            "platform not a dict": ([{**good, "platform": "linux/arm64"}], "names no platform"),
            "path in the arch": ([{**good, "platform": {"os": "linux", "architecture": "../../etc"}}], "os/architecture"),
            "empty os": ([{**good, "platform": {"os": "", "architecture": "arm64"}}], "os/architecture"),
            "number": ([{**good, "platform": {"os": "linux", "architecture": 64}}], "os/architecture"),
            "twice": ([good, good], "linux/arm64 twice"),
            "nested index": ([{**good, "mediaType": sbom.OCI_INDEX}], "not an OCI image manifest"),
            "hostile digest": ([{**good, "digest": "sha256:../../x"}], "digest"),
            "altered blob": ([{**good, "size": good["size"] + 1}], "its descriptor says"),
        }
        for name, (entries, expected) in cases.items():
            oci_index_archive(self.path, entries=entries, blobs=blobs)
            with self.subTest(name):
                self.refused(sbom.oci_archive_platforms, self.path, contains=(expected,))
        # a blob whose contents are not what its digest says
        other = image_manifest("amd64")
        oci_index_archive(self.path, entries=[good], blobs={"blobs/sha256/" + good["digest"][7:]: other[:good["size"]].ljust(good["size"])})
        self.refused(sbom.oci_archive_platforms, self.path, contains=("do not hash to",))
        # the platform's manifest missing from the archive
        oci_index_archive(self.path, entries=[good], blobs={})
        self.refused(sbom.oci_archive_platforms, self.path, contains=("no blobs/sha256/",))

    def test_oversized_index(self):
        entries = []
        blobs = {}
        for i in range(3):
            entry, blob = self.entry(arch=f"arch{i}")
            entries.append(entry)
            blobs.update(blob)
        oci_index_archive(self.path, entries=entries, blobs=blobs)
        self.assertEqual(len(sbom.oci_archive_platforms(self.path)), 3)
        with mock.patch.object(sbom, "MAX_PLATFORMS", 2):
            self.refused(sbom.oci_archive_platforms, self.path, contains=("lists 3 manifests",))

    def test_index_blob_not_json(self):
        oci_archive(self.path, manifest=b"{not json", index={"manifests": [
            {"mediaType": sbom.OCI_INDEX, "digest": "sha256:" + hashlib.sha256(b"{not json").hexdigest(), "size": 9}]})
        self.refused(sbom.oci_archive_platforms, self.path, contains=("image index is not valid JSON",))


class Cli(Refused):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def binary(self, name, data):
        path = os.path.join(self.tmp.name, name)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def run_main(self, *argv):
        err = io.StringIO()
        out = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = sbom.main(list(argv))
        return code, out.getvalue(), err.getvalue()

    def test_writes_the_sbom(self):
        a = self.binary("athenz-daemons", make_elf([(".dep-v0", section_of(DAEMONS))]))
        b = self.binary("athenz-sia", make_elf([(".dep-v0", section_of(SIA))]))
        out = os.path.join(self.tmp.name, "x.cdx.json")
        code, _, err = self.run_main("sbom", "--name", "img", "--version", "0.2.0", "--digest",
                                     "sha256:" + "1" * 64, "--output", out, a, b)
        self.assertEqual(code, 0, err)
        with open(out) as f:
            doc = json.load(f)
        self.assertEqual(len(doc["components"]), 6)
        self.assertIn("6 components from 2 binaries", err)

    def test_refuses_and_writes_nothing(self):
        good = self.binary("good", make_elf([(".dep-v0", section_of(DAEMONS))]))
        cases = {
            "no-section": make_elf([(".text", b"\x90")]),
            "not-zlib": make_elf([(".dep-v0", b"garbage")]),
            "wrong-shape": make_elf([(".dep-v0", zlib.compress(b'{"packages":{}}'))]),
            "out-of-range": make_elf([(".dep-v0", section_of([pkg("a", dependencies=[7])]))]),
            "script": b"#!/bin/sh\n",
        }
        out = os.path.join(self.tmp.name, "x.cdx.json")
        for name, data in cases.items():
            bad = self.binary(name, data)
            code, _, err = self.run_main("sbom", "--name", "i", "--version", "1", "--output", out, good, bad)
            self.assertEqual(code, 1, name)
            self.assertTrue(err.startswith(f"sbom.py: {bad}: "), err)
            self.assertFalse(os.path.exists(out), name)
        code, _, err = self.run_main("sbom", "--name", "i", "--version", "1", "--output", out,
                                     os.path.join(self.tmp.name, "absent"))
        self.assertEqual(code, 1)
        self.assertIn("absent", err)

    def test_digest(self):
        path = os.path.join(self.tmp.name, "a.oci.tar")
        digest = oci_archive(path)
        self.assertEqual(self.run_main("digest", path), (0, digest + "\n", ""))
        code, out, err = self.run_main("digest", os.path.join(self.tmp.name, "none"))
        self.assertEqual((code, out), (1, ""))

    def test_platforms(self):
        path = os.path.join(self.tmp.name, "i.oci.tar")
        _, platforms = oci_index_archive(path)
        expected = "".join(f"{name} {platforms[name]}\n" for name in ("linux/amd64", "linux/arm64"))
        self.assertEqual(self.run_main("platforms", path), (0, expected, ""))
        oci_archive(path)
        code, out, err = self.run_main("platforms", path)
        self.assertEqual((code, out), (1, ""))
        self.assertIn("not an index", err)

    def test_a_platforms_sbom(self):
        a = self.binary("athenz-sia", make_elf([(".dep-v0", section_of(SIA))]))
        out = os.path.join(self.tmp.name, "x.cdx.json")
        code, _, err = self.run_main("sbom", "--name", "img", "--version", "0.2.0", "--digest",
                                     "sha256:" + "1" * 64, "--arch", "arm64", "--output", out, a)
        self.assertEqual(code, 0, err)
        with open(out) as f:
            image = json.load(f)["metadata"]["component"]
        self.assertIn("?arch=arm64&", image["purl"])
        self.assertEqual(image["properties"], [{"name": "oci:platform", "value": "linux/arm64"}])
        os.unlink(out)
        code, _, err = self.run_main("sbom", "--name", "img", "--version", "0.2.0", "--arch", "s390x",
                                     "--output", out, a)
        self.assertEqual(code, 1)
        self.assertIn("'s390x' is not one of amd64, arm64", err)
        self.assertFalse(os.path.exists(out))

    def test_runs_as_a_script(self):
        path = os.path.join(self.tmp.name, "a.oci.tar")
        digest = oci_archive(path)
        run = subprocess.run([sys.executable, os.path.join(HERE, "sbom.py"), "digest", path],
                             capture_output=True, text=True, check=False)
        self.assertEqual((run.returncode, run.stdout), (0, digest + "\n"), run.stderr)


if __name__ == "__main__":
    unittest.main()
