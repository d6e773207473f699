#!/usr/bin/env python3
"""ctest doc_paths_test: every repository path a guide names exists.

Usage: check_doc_paths.py ROOT DOC [DOC ...]   (DOC relative to ROOT)
       check_doc_paths.py ROOT --all           (every .md of the tree)

A path is what a guide writes in backticks or as a link target and that looks
like a file or folder of the tree: it has a '/' or a source-file suffix.
  - `epd/<layer>/x.h` is a public header: include/epd/<layer>/x.h;
  - `src/worker/` and `docs/L3.md` are relative to the root, a link target
    relative to the document (its #anchor dropped);
  - a bare file name (`job_table.cc`) must exist somewhere in the tree;
  - a glob (`tests/python/test_*.py`) must match at least one file;
  - a file of another project is written with the project and a colon
    (`vllm:vllm/multimodal/processing.py`) and is not checked, nor are the
    file names every Hugging Face checkpoint has (`config.json`, ...);
  - HTTP routes (`/metrics`), key namespaces (`epd/key/video`: under epd/,
    only a header `epd/<layer>/x.h` or a folder `epd/<layer>/` is a path),
  - what the build or the install writes (`build/...`, `build-*/`, the generated
    `epd/v1/`, `epd/core/version.h`; `lib/`, `bin/`, `share/` under an
    install prefix), paths outside the tree (`../`), URLs, commands with spaces or options, and
    placeholders (`<layer>`, `...`) are not checked.
Exits 1 naming each path that does not exist, with its line.
"""
import glob
import os
import re
import sys

SUFFIXES = (".h", ".cc", ".cu", ".py", ".md", ".cmake", ".sh", ".json", ".proto", ".txt", ".in", ".conf", ".service")
GENERATED = ("build/", "build-", "BUILD_DIR/", "bench-gpu/", "$OUT/", "epd/v1/", "/tmp/", "/dev/", "~", "../")
# What `cmake --install` writes under its prefix.
INSTALLED = ("lib/", "bin/", "share/", "include/epd/<")
GENERATED_FILES = {"epd/core/version.h", "version.h", "compile_commands.json", "epd/_service_config.py",
                   "epd/_version.py", "epdConfig.cmake", "epdConfigVersion.cmake", "epd.pc"}
# Files of other projects that the docs name by their fixed name.
EXTERNAL_FILES = {"config.json", "preprocessor_config.json", "model.safetensors.index.json", "health.proto"}


def candidates(line):
    for m in re.finditer(r"`([^`\s]+)`", line):
        yield m.group(1), False
    for m in re.finditer(r"\]\(([^)\s]+)\)", line):
        yield m.group(1), True


def looks_like_path(tok):
    if "://" in tok or "::" in tok or tok.startswith(("-", "$", "@", "/")) or "=" in tok:
        return False  # URLs, code, options, variables, HTTP routes
    if tok.startswith("epd/") and not tok.endswith((".h", "/")):
        return False  # a key namespace (epd/key/video), not a header
    if not re.fullmatch(r"[A-Za-z0-9_.\-/*]+", tok):
        return False  # placeholders (<layer>), code, commands
    if "..." in tok:
        return False
    return "/" in tok or tok.endswith(SUFFIXES)


def repository_id(tok, root):
    """`Qwen/Qwen2.5-VL-3B-Instruct`, `vllm-project/vllm`: owner/name of a
    hub model or a repository (two parts, no file suffix, the first not a
    folder of the tree)."""
    parts = tok.split("/")
    return (len(parts) == 2 and all(parts) and not tok.endswith(SUFFIXES) and
            not os.path.exists(os.path.join(root, parts[0])) and parts[0] != "epd")


def all_files(root):
    names = set()
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if not x.startswith(".") and not x.startswith("build")]
        names.update(files)
    return names


def check(root, doc, names):
    errors = []
    doc_dir = os.path.dirname(os.path.join(root, doc))
    in_code = False
    for n, line in enumerate(open(os.path.join(root, doc), encoding="utf-8"), 1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        for tok, is_link in candidates(line):
            tok = tok.split("#", 1)[0].rstrip(".,;:")
            if not tok or not looks_like_path(tok):
                continue
            if tok.startswith(GENERATED + INSTALLED) or tok in GENERATED_FILES | EXTERNAL_FILES:
                continue
            if repository_id(tok, root):
                continue
            if is_link:
                path = os.path.normpath(os.path.join(doc_dir, tok))
            elif tok.startswith("epd/"):
                path = os.path.join(root, "include", tok)
            elif "/" not in tok:
                if tok not in names:
                    errors.append(f"{doc}:{n}: `{tok}` names no file of the tree")
                continue
            else:
                path = os.path.join(root, tok)
            if "*" in tok:
                if not glob.glob(path):
                    errors.append(f"{doc}:{n}: `{tok}` matches no file")
            elif not os.path.exists(path):
                errors.append(f"{doc}:{n}: `{tok}` does not exist ({os.path.relpath(path, root)})")
    return errors


def every_doc(root):
    docs = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if not x.startswith((".", "build")) and x != "shared")
        docs += [os.path.relpath(os.path.join(d, f), root) for f in sorted(files) if f.endswith(".md")]
    return docs


def layout_errors(root):
    """README.md's layout block names every folder of src/."""
    text = open(os.path.join(root, "README.md"), encoding="utf-8").read()
    if "## Layout" not in text:
        return ["README.md: no '## Layout' section"]
    block = text.split("## Layout", 1)[1].split("```")[1]
    named = set(re.findall(r"^src/([\w-]+)/", block, re.M))
    have = {d for d in os.listdir(os.path.join(root, "src")) if os.path.isdir(os.path.join(root, "src", d))}
    return [f"README.md: the layout block does not name src/{d}/" for d in sorted(have - named)]


def main():
    root, docs = sys.argv[1], sys.argv[2:]
    errors = []
    if docs == ["--all"]:
        docs = every_doc(root)
        errors += layout_errors(root)
    names = all_files(root)
    for doc in docs:
        errors += check(root, doc, names)
    if errors:
        print("\n".join(errors))
        print(f"doc_paths_test: {len(errors)} path(s) named in {len(docs)} documents do not exist")
        return 1
    print(f"doc_paths_test: every path named in {len(docs)} documents exists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
