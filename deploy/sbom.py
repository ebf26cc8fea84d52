#!/usr/bin/env python3
"""The release's software bill of materials and image digest, for deploy/image.sh.

    deploy/sbom.py sbom --name NAME --version TAG [--digest sha256:HEX] [--arch ARCH]
                        [--timestamp TIME] --output FILE BINARY...
    deploy/sbom.py digest ARCHIVE
    deploy/sbom.py platforms ARCHIVE

`sbom` writes a CycloneDX 1.5 JSON document describing the image NAME:TAG from the dependency
lists the binaries embed: `cargo auditable` stores each binary's dependency graph as
zlib-compressed JSON in the ELF section `.dep-v0` (rust-audit's format:
{"packages": [{"name", "version", "source", "kind"?, "dependencies"?: [index...], "root"?}]}).
One component per distinct (name, version) across the binaries, purl `pkg:cargo/NAME@VERSION`
for crates.io packages, the dependency graph, and the image as metadata.component (with its
`pkg:oci` purl when --digest is given). Build-only packages (proc macros, build scripts) are
listed with scope "excluded": they are not in the binaries.

`digest` prints the manifest digest (`sha256:HEX`) of an OCI archive (`buildah push
oci-archive:...`, or `buildah manifest push --all` of a multi-platform index): the one manifest
its index.json names, checked against the blob it stores. `platforms` prints, for an archive of
an image index, one line per platform: `linux/<arch> sha256:HEX`, each checked against its blob.

The input is treated as untrusted: a binary without the section, a section that does not
decompress (or decompresses to more than MAX_JSON_BYTES), JSON of the wrong shape, more than
MAX_PACKAGES packages, dependency indexes out of range, more than one root or a cyclic graph
are refused with an error naming the file; nothing is written then. Standard library only.
Tests: python3 -m unittest deploy/test_sbom.py
"""

import argparse
import hashlib
import json
import os
import re
import struct
import sys
import tarfile
import tempfile
import urllib.parse
import zlib

SECTION = ".dep-v0"
# Caps on what a binary may make us read or allocate. A real image's lists are far smaller
# (about 400 packages, 40 KiB of JSON, 10 KiB compressed).
MAX_PACKAGES = 100_000
MAX_DEPENDENCY_EDGES = 1_000_000
MAX_SECTION_BYTES = 16 * 1024 * 1024
MAX_JSON_BYTES = 32 * 1024 * 1024
MAX_SECTIONS = 65_536
# index.json and a manifest are a few hundred bytes
MAX_OCI_JSON_BYTES = 1024 * 1024

# Cargo's package names (crates.io allows 64 characters; local packages are not checked by it)
NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,127}\Z")
# semver.org's grammar (Cargo's versions are semver)
VERSION_RE = re.compile(
    r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"
    r"(-(0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)(\.(0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*))*)?"
    r"(\+[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?\Z"
)
# "crates.io", "git", "local", "registry", or another source's name (rust-audit keeps it open)
SOURCE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/+-]{0,255}\Z")
KINDS = ("runtime", "build")
DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}\Z")
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
# an image index lists a manifest per platform: the release has two
MAX_PLATFORMS = 64
# an OCI platform's os or architecture ("linux", "amd64", "arm64")
PLATFORM_PART_RE = re.compile(r"[a-z0-9][a-z0-9_.-]{0,31}\Z")
# the architectures the release builds (deploy/image.sh), as --arch takes them
ARCHES = ("amd64", "arm64")


class SbomError(Exception):
    """Input refused; the message names the file and what is wrong with it."""


# ---------------------------------------------------------------------------------------------
# ELF: the bytes of one section, every offset checked against the file's size


def elf_section(data, name=SECTION, source="<bytes>"):
    """The contents of the section `name` of the ELF file `data` (bytes)."""
    size = len(data)
    if size < 16 or data[:4] != b"\x7fELF":
        raise SbomError(f"{source}: not an ELF file")
    elf_class, elf_data = data[4], data[5]
    if elf_class not in (1, 2):
        raise SbomError(f"{source}: unknown ELF class {elf_class}")
    if elf_data not in (1, 2):
        raise SbomError(f"{source}: unknown ELF byte order {elf_data}")
    end = "<" if elf_data == 1 else ">"
    if elf_class == 2:
        header = struct.Struct(end + "HHIQQQIHHHHHH")
        section_header = struct.Struct(end + "IIQQQQIIQQ")
    else:
        header = struct.Struct(end + "HHIIIIIHHHHHH")
        section_header = struct.Struct(end + "IIIIIIIIII")
    if size < 16 + header.size:
        raise SbomError(f"{source}: truncated ELF header")
    (_, _, _, _, _, shoff, _, _, _, _, shentsize, shnum, shstrndx) = header.unpack_from(data, 16)
    if shoff == 0:
        raise SbomError(f"{source}: no section table, so no {name} section")
    if shentsize != section_header.size:
        raise SbomError(f"{source}: section header size {shentsize}, not {section_header.size}")

    def header_at(index, count):
        if index >= count:
            raise SbomError(f"{source}: section {index} of {count}")
        offset = shoff + index * shentsize
        if offset + shentsize > size:
            raise SbomError(f"{source}: section header {index} lies past the end of the file")
        # (name, type, flags, addr, offset, size, link, info, addralign, entsize)
        return section_header.unpack_from(data, offset)

    # more than 0xff00 sections, or a string table index past 0xff00: the real numbers are in
    # section 0 (the ELF spec's extended numbering)
    if shnum == 0:
        shnum = header_at(0, 1)[5]
    if shstrndx == 0xFFFF:
        shstrndx = header_at(0, max(shnum, 1))[6]
    if shnum > MAX_SECTIONS:
        raise SbomError(f"{source}: {shnum} sections (at most {MAX_SECTIONS})")
    if shoff + shnum * shentsize > size:
        raise SbomError(f"{source}: the section table lies past the end of the file")

    def contents(fields, what):
        kind, flags, offset, length = fields[1], fields[2], fields[4], fields[5]
        if kind == 8:  # SHT_NOBITS: no bytes in the file
            raise SbomError(f"{source}: {what} has no contents in the file")
        if flags & 0x800:  # SHF_COMPRESSED
            raise SbomError(f"{source}: {what} is compressed by the linker, which is not supported")
        if offset > size or length > size - offset:
            raise SbomError(f"{source}: {what} lies past the end of the file")
        return data[offset:offset + length]

    strtab = contents(header_at(shstrndx, shnum), "the section name table")
    found = []
    for index in range(shnum):
        fields = header_at(index, shnum)
        start = fields[0]
        if start >= len(strtab):
            raise SbomError(f"{source}: section {index}'s name lies outside the name table")
        stop = strtab.find(b"\0", start)
        if stop < 0:
            raise SbomError(f"{source}: section {index}'s name is not terminated")
        if strtab[start:stop] == name.encode():
            found.append(fields)
    if not found:
        raise SbomError(
            f"{source}: no {name} section: not built with `cargo auditable` "
            "(deploy/build-binaries.sh), or its section was stripped"
        )
    if len(found) > 1:
        raise SbomError(f"{source}: {len(found)} {name} sections")
    section = contents(found[0], f"the {name} section")
    if len(section) > MAX_SECTION_BYTES:
        raise SbomError(f"{source}: the {name} section is {len(section)} bytes (at most {MAX_SECTION_BYTES})")
    return section


# ---------------------------------------------------------------------------------------------
# The dependency list: decompressed with a cap, parsed strictly, checked as rust-audit does


def decompress(section, source="<bytes>"):
    """The JSON text of a zlib stream, refusing more than MAX_JSON_BYTES of it."""
    inflater = zlib.decompressobj()
    try:
        text = inflater.decompress(section, MAX_JSON_BYTES)
    except zlib.error as e:
        raise SbomError(f"{source}: the {SECTION} section does not decompress (zlib: {e})") from None
    if inflater.unconsumed_tail or len(text) >= MAX_JSON_BYTES:
        raise SbomError(f"{source}: the {SECTION} section decompresses to more than {MAX_JSON_BYTES} bytes")
    if not inflater.eof:
        raise SbomError(f"{source}: the {SECTION} section is a truncated zlib stream")
    if inflater.unused_data:
        raise SbomError(f"{source}: the {SECTION} section has {len(inflater.unused_data)} bytes after its zlib stream")
    return text


def _no_duplicate_keys(pairs):
    obj = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"duplicate key {key!r}")
        obj[key] = value
    return obj


def _no_constants(name):
    raise ValueError(f"{name} is not JSON")


def _is_int(value):
    # bool is an int in Python; JSON's true is not an index
    return type(value) is int


def parse_packages(text, source="<bytes>"):
    """The checked package list of rust-audit's JSON (bytes or str): a list of dicts with name,
    version, source, kind ("runtime"/"build"), dependencies (sorted, distinct indexes), root."""
    if isinstance(text, bytes):
        if len(text) > MAX_JSON_BYTES:
            raise SbomError(f"{source}: the dependency list is more than {MAX_JSON_BYTES} bytes")
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise SbomError(f"{source}: the dependency list is not UTF-8 ({e})") from None
    try:
        doc = json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constants)
    except RecursionError:
        raise SbomError(f"{source}: the dependency list is nested too deeply") from None
    except ValueError as e:  # json.JSONDecodeError, a duplicate key, an int too long to convert
        raise SbomError(f"{source}: the dependency list is not valid JSON ({e})") from None

    def wrong(what):
        return SbomError(f"{source}: not a cargo-auditable dependency list: {what}")

    if not isinstance(doc, dict):
        raise wrong("the document is not an object")
    if "format" in doc and not (_is_int(doc["format"]) and doc["format"] >= 0):
        raise wrong("format is not a non-negative integer")
    raw = doc.get("packages")
    if not isinstance(raw, list):
        raise wrong("no packages array")
    if not raw:
        raise wrong("the packages array is empty")
    if len(raw) > MAX_PACKAGES:
        raise SbomError(f"{source}: {len(raw)} packages (at most {MAX_PACKAGES})")

    packages = []
    edges = 0
    roots = 0
    for i, p in enumerate(raw):
        if not isinstance(p, dict):
            raise wrong(f"package {i} is not an object")
        for field, pattern in (("name", NAME_RE), ("version", VERSION_RE), ("source", SOURCE_RE)):
            value = p.get(field)
            if not isinstance(value, str):
                raise wrong(f"package {i} has no {field} string")
            if not pattern.match(value):
                raise wrong(f"package {i}'s {field} {value[:80]!r} is not a valid {field}")
        kind = p.get("kind", "runtime")
        if kind not in KINDS:
            raise wrong(f"package {i}'s kind {str(kind)[:80]!r} is not one of {KINDS}")
        root = p.get("root", False)
        if not isinstance(root, bool):
            raise wrong(f"package {i}'s root is not a boolean")
        roots += root
        deps = p.get("dependencies", [])
        if not isinstance(deps, list):
            raise wrong(f"package {i}'s dependencies is not an array")
        edges += len(deps)
        if edges > MAX_DEPENDENCY_EDGES:
            raise SbomError(f"{source}: more than {MAX_DEPENDENCY_EDGES} dependency edges")
        for d in deps:
            if not _is_int(d):
                raise wrong(f"package {i} has a dependency index that is not an integer")
            if not 0 <= d < len(raw):
                raise SbomError(
                    f"{source}: package {i} ({p['name']}) depends on index {d}, out of range "
                    f"(0..{len(raw) - 1})"
                )
        packages.append({
            "name": p["name"],
            "version": p["version"],
            "source": p["source"],
            "kind": kind,
            "dependencies": sorted(set(deps)),
            "root": root,
        })
    if roots > 1:
        raise wrong(f"{roots} root packages")
    cycle = _cycle_member(packages)
    if cycle is not None:
        raise wrong(f"the dependency graph has a cycle through package {cycle} ({packages[cycle]['name']})")
    return packages


def _cycle_member(packages):
    """A package on a cycle, or None (Kahn's algorithm: no recursion, linear time)."""
    indegree = [0] * len(packages)
    for p in packages:
        for d in p["dependencies"]:
            indegree[d] += 1
    ready = [i for i, n in enumerate(indegree) if n == 0]
    seen = 0
    while ready:
        i = ready.pop()
        seen += 1
        for d in packages[i]["dependencies"]:
            indegree[d] -= 1
            if indegree[d] == 0:
                ready.append(d)
    if seen == len(packages):
        return None
    return next(i for i, n in enumerate(indegree) if n > 0)


def binary_packages(path):
    """The checked package list embedded in the binary at `path`."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise SbomError(f"{path}: {e.strerror}") from None
    return parse_packages(decompress(elf_section(data, SECTION, path), path), path)


# ---------------------------------------------------------------------------------------------
# CycloneDX


def component_ref(name, version, source):
    if source == "crates.io":
        return purl(name, version)
    return f"cargo:{source}/{name}@{version}"


def purl(name, version):
    return f"pkg:cargo/{name}@{urllib.parse.quote(version, safe='')}"


def oci_purl(image, tag, digest, arch=None):
    """pkg:oci/NAME@DIGEST?[arch=ARCH&]repository_url=REPO&tag=TAG (the purl spec's type for OCI
    images; `arch` names one platform's image of a multi-platform index)."""
    last = image.rsplit("/", 1)[-1].lower()
    qualifiers = {"arch": arch} if arch else {}
    qualifiers.update({"repository_url": image, "tag": tag})
    qualifiers = urllib.parse.urlencode(qualifiers, safe="/")
    return f"pkg:oci/{urllib.parse.quote(last, safe='')}@{urllib.parse.quote(digest, safe='')}?{qualifiers}"


def merge(binaries):
    """One entry per (name, version) over [(path, packages)]: source, kind (runtime wins), the
    (name, version)s it depends on, whether it is a binary's root."""
    merged = {}
    for path, packages in binaries:
        keys = [(p["name"], p["version"]) for p in packages]
        for p, key in zip(packages, keys):
            entry = merged.setdefault(key, {
                "source": p["source"], "kind": p["kind"], "deps": set(), "root": False,
            })
            if entry["source"] != p["source"]:
                raise SbomError(
                    f"{path}: {key[0]} {key[1]} comes from {p['source']}, and from "
                    f"{entry['source']} in another binary: one (name, version), two packages"
                )
            if p["kind"] == "runtime":
                entry["kind"] = "runtime"
            entry["root"] = entry["root"] or p["root"]
            entry["deps"].update(keys[d] for d in p["dependencies"])
    return merged


def cyclonedx(binaries, image, tag, digest=None, timestamp=None, arch=None):
    """The CycloneDX 1.5 document (a dict) of the image `image`:`tag` holding `binaries`, a list
    of (path, packages from parse_packages); `arch`: the platform (linux/<arch>) whose image this
    is, named in the image's purl and as a property."""
    if digest is not None and not DIGEST_RE.match(digest):
        raise SbomError(f"the digest {digest!r} is not sha256:<64 hex digits>")
    if arch is not None and arch not in ARCHES:
        raise SbomError(f"the architecture {arch!r} is not one of {', '.join(ARCHES)}")
    merged = merge(binaries)
    refs = {key: component_ref(key[0], key[1], e["source"]) for key, e in merged.items()}
    components = []
    dependencies = []
    for key in sorted(merged):
        entry = merged[key]
        component = {
            "type": "application" if entry["root"] else "library",
            "bom-ref": refs[key],
            "name": key[0],
            "version": key[1],
            "scope": "required" if entry["kind"] == "runtime" else "excluded",
        }
        if entry["source"] == "crates.io":
            component["purl"] = purl(*key)
        component["properties"] = [{"name": "cargo:source", "value": entry["source"]}]
        components.append(component)
        dependencies.append({"ref": refs[key], "dependsOn": sorted(refs[d] for d in entry["deps"])})

    image_component = {"type": "container", "name": image, "version": tag}
    if arch is not None:
        image_component["properties"] = [{"name": "oci:platform", "value": f"linux/{arch}"}]
    if digest is not None:
        image_component["bom-ref"] = oci_purl(image, tag, digest, arch)
        image_component["purl"] = image_component["bom-ref"]
    else:
        image_component["bom-ref"] = f"image:{image}:{tag}"
    roots = sorted(refs[key] for key, e in merged.items() if e["root"])
    dependencies.insert(0, {"ref": image_component["bom-ref"], "dependsOn": roots})

    metadata = {}
    if timestamp:
        metadata["timestamp"] = timestamp
    metadata["tools"] = {"components": [{"type": "application", "name": "athenz-k8s-identity deploy/sbom.py"}]}
    metadata["component"] = image_component
    return {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "version": 1,
        "metadata": metadata,
        "components": components,
        "dependencies": dependencies,
    }


# ---------------------------------------------------------------------------------------------
# The OCI archive's digest


def _read_member(archive, tar, name, limit):
    try:
        member = tar.getmember(name)
    except KeyError:
        raise SbomError(f"{archive}: no {name}") from None
    if not member.isfile():
        raise SbomError(f"{archive}: {name} is not a regular file")
    if member.size > limit:
        raise SbomError(f"{archive}: {name} is {member.size} bytes (at most {limit})")
    return tar.extractfile(member).read()


def _parse_json(archive, raw, what):
    """`raw` (index.json or a blob of the archive) as JSON: no duplicate keys, no NaN."""
    try:
        return json.loads(raw, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constants)
    except (ValueError, RecursionError) as e:
        raise SbomError(f"{archive}: {what} is not valid JSON ({e})") from None


def _descriptor_digest(archive, descriptor, what):
    digest = descriptor.get("digest") if isinstance(descriptor, dict) else None
    if not isinstance(digest, str) or not DIGEST_RE.match(digest):
        raise SbomError(f"{archive}: {what}'s digest is not sha256:<64 hex digits>")
    return digest


def _blob(archive, tar, descriptor, digest, what):
    """The blob `descriptor` names, checked against its size and digest."""
    blob = _read_member(archive, tar, "blobs/sha256/" + digest[7:], MAX_OCI_JSON_BYTES)
    if descriptor.get("size") != len(blob):
        raise SbomError(f"{archive}: {what} is {len(blob)} bytes, its descriptor says {descriptor.get('size')}")
    if "sha256:" + hashlib.sha256(blob).hexdigest() != digest:
        raise SbomError(f"{archive}: {what}'s contents do not hash to {digest}")
    return blob


def _index_platforms(archive, tar, index):
    """{"os/arch": digest} of the image manifests an image index (parsed) lists, each checked
    against its blob: at most MAX_PLATFORMS, each platform once, each an OCI image manifest."""
    entries = index.get("manifests") if isinstance(index, dict) else None
    if not isinstance(entries, list) or not entries:
        raise SbomError(f"{archive}: the image index lists no manifest")
    if len(entries) > MAX_PLATFORMS:
        raise SbomError(f"{archive}: the image index lists {len(entries)} manifests (at most {MAX_PLATFORMS})")
    platforms = {}
    for entry in entries:
        platform = entry.get("platform") if isinstance(entry, dict) else None
        if not isinstance(platform, dict):
            raise SbomError(f"{archive}: a manifest of the image index names no platform")
        os_name, arch = platform.get("os"), platform.get("architecture")
        if not isinstance(os_name, str) or not isinstance(arch, str) \
                or not PLATFORM_PART_RE.match(os_name) or not PLATFORM_PART_RE.match(arch):
            raise SbomError(f"{archive}: a platform of the image index is not os/architecture: {platform!r:.80}")
        name = f"{os_name}/{arch}"
        if name in platforms:
            raise SbomError(f"{archive}: the image index lists {name} twice")
        if entry.get("mediaType") != OCI_MANIFEST:
            raise SbomError(f"{archive}: {name} is not an OCI image manifest")
        platform_digest = _descriptor_digest(archive, entry, name)
        _blob(archive, tar, entry, platform_digest, name)
        platforms[name] = platform_digest
    return platforms


def oci_archive(archive):
    """(digest, platforms) of the OCI archive (a tar) at `archive`: the digest of the one
    manifest its index.json names, an image manifest or an image index (`buildah manifest push
    --all`), checked against its blob; and for an index, {"linux/<arch>": digest} of the image
    manifests it lists (each checked against its blob), for an image manifest {}."""
    try:
        with tarfile.open(archive, "r:") as tar:
            index = _parse_json(archive, _read_member(archive, tar, "index.json", MAX_OCI_JSON_BYTES), "index.json")
            manifests = index.get("manifests") if isinstance(index, dict) else None
            if not isinstance(manifests, list) or len(manifests) != 1 or not isinstance(manifests[0], dict):
                raise SbomError(f"{archive}: index.json does not name exactly one manifest")
            top = manifests[0]
            digest = _descriptor_digest(archive, top, "the manifest")
            if top.get("mediaType") == OCI_MANIFEST:
                _blob(archive, tar, top, digest, "the manifest")
                return digest, {}
            if top.get("mediaType") != OCI_INDEX:
                raise SbomError(f"{archive}: the manifest is not an OCI image manifest or index")
            nested = _parse_json(archive, _blob(archive, tar, top, digest, "the image index"), "the image index")
            return digest, _index_platforms(archive, tar, nested)
    except (tarfile.TarError, OSError) as e:
        raise SbomError(f"{archive}: not a readable tar ({e})") from None


def oci_archive_digest(archive):
    """sha256:HEX of the one manifest (an image's, or an index's) in the OCI archive at `archive`."""
    return oci_archive(archive)[0]


def oci_archive_platforms(archive):
    """{"os/arch": sha256:HEX} of the image index in the OCI archive at `archive`; an archive of
    one image manifest is refused (it has no platforms to list)."""
    digest, platforms = oci_archive(archive)
    if not platforms:
        raise SbomError(f"{archive}: {digest} is one image, not an index of platforms")
    return platforms


# ---------------------------------------------------------------------------------------------


def write_atomically(path, text):
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".sbom-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def main(argv=None):
    parser = argparse.ArgumentParser(prog="sbom.py", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    sbom = commands.add_parser("sbom", help="write the CycloneDX SBOM of the image")
    sbom.add_argument("--name", required=True, help="the image's name, e.g. ghcr.io/o/athenz-k8s-identity")
    sbom.add_argument("--version", required=True, help="the image's tag")
    sbom.add_argument("--digest", help="the image's manifest digest, sha256:HEX")
    sbom.add_argument("--timestamp", help="metadata.timestamp (ISO 8601), e.g. the commit's time")
    sbom.add_argument("--arch", help="the platform's architecture (linux/ARCH), for an index's image")
    sbom.add_argument("--output", required=True, help="where to write the JSON")
    sbom.add_argument("binaries", nargs="+", help="the binaries the image holds")
    digest = commands.add_parser("digest", help="print the manifest (or index) digest of an OCI archive")
    digest.add_argument("archive")
    platforms = commands.add_parser("platforms", help="print each platform's manifest digest of an OCI index archive")
    platforms.add_argument("archive")
    args = parser.parse_args(argv)
    try:
        if args.command == "digest":
            print(oci_archive_digest(args.archive))
            return 0
        if args.command == "platforms":
            for name, digest in sorted(oci_archive_platforms(args.archive).items()):
                print(f"{name} {digest}")
            return 0
        binaries = [(path, binary_packages(path)) for path in args.binaries]
        doc = cyclonedx(binaries, args.name, args.version, args.digest, args.timestamp, args.arch)
        write_atomically(args.output, json.dumps(doc, indent=2, sort_keys=False) + "\n")
        print(
            f"sbom.py: {args.output}: {len(doc['components'])} components from "
            f"{len(binaries)} binaries",
            file=sys.stderr,
        )
        return 0
    except SbomError as e:
        print(f"sbom.py: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
