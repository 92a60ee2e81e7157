"""The peers' source files (open pull requests of flash-attention), assembled into the gitignored `.peers/` from a git
clone, each checked against bench/peers_manifest.json; the bench that times them refuses when one is missing or differs.

    git clone https://github.com/Dao-AILab/flash-attention /tmp/fa && git -C /tmp/fa fetch origin \\
        refs/pull/2634/head:refs/pull/2634/head refs/pull/2771/head:refs/pull/2771/head
    python3 bench/peer_sources.py assemble --git /tmp/fa      # writes .peers/ (about 2.9 MB), verifies every file
    python3 bench/peer_sources.py check                       # verifies .peers/ against the manifest

Their code is never committed: the manifest names each file by repository, commit and path with the sha256 of the
blob and of the file as assembled. A peer with a `package` runs in the same process as the pinned flash-attn-4, so
its files are the import closure of its roots (every `flash_attn.cute` module they import, computed from the source),
written as the top-level package `package` with every `flash_attn.cute` rewritten to that name (the only change; a
plain text substitution, so the assembled sha256 follows from the blob). A peer without one (#2771: its backward
configs are expressed through our backward class, its code is only read) keeps its files verbatim under its name.
`record` writes the manifest from a clone (what a maintainer runs when a peer's commit moves).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "bench" / "peers_manifest.json"
PEERS_DIR = ROOT / ".peers"
PACKAGE_PREFIX = "flash_attn/cute/"
MAX_BYTES = 5 * 2**20  # the lead carries .peers/ with the tree (64 MiB a call in all)
UPSTREAM_PACKAGE = re.compile(r"\bflash_attn\.cute\b")


class PeersMissing(RuntimeError):
    """`.peers/` is absent or differs from the manifest: one message naming the file and what to run."""


def rewrite(text: str, package: str) -> str:
    """A peer's module as its own top-level package: every `flash_attn.cute` becomes `package`."""
    return UPSTREAM_PACKAGE.sub(package, text)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def git_show(git_dir: Path, commit: str, path: str) -> bytes | None:
    """The blob at `commit:path` of the clone, None where the path is not in that commit."""
    done = subprocess.run(["git", "-C", str(git_dir), "show", f"{commit}:{path}"], capture_output=True)
    return done.stdout if done.returncode == 0 else None


def imported_modules(source: str, package_modules: set[str]) -> set[str]:
    """Modules of the flash_attn.cute package that `source` imports (relative or absolute, any depth of the tree)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        names = []
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 1 or module.startswith("flash_attn.cute"):
                rest = module[len("flash_attn.cute"):].lstrip(".") if node.level == 0 else module
                names = [rest.split(".")[0]] if rest else [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name.split(".")[2] for a in node.names if a.name.startswith("flash_attn.cute.")]
        found |= {n for n in names if n in package_modules}
    return found


def import_closure(read, roots: list[str], package_modules: set[str]) -> list[str]:
    """Every package module the roots reach through their imports (`read(module) -> source`), sorted."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        todo.extend(imported_modules(read(module), package_modules) - seen)
    return sorted(seen)


def package_modules(git_dir: Path, commit: str) -> set[str]:
    done = subprocess.run(["git", "-C", str(git_dir), "ls-tree", "--name-only", commit, PACKAGE_PREFIX],
                          capture_output=True, text=True, check=True)
    return {Path(p).stem for p in done.stdout.split() if p.endswith(".py") and p.count("/") == 2}


def target_path(peer: dict, path: str) -> Path:
    """Where a peer's file lies under .peers/: in its package (flat), or verbatim under its name."""
    if peer.get("package"):
        return Path(peer["package"]) / Path(path).name
    return Path(peer["name"]) / path


def assembled_bytes(peer: dict, blob: bytes) -> bytes:
    return rewrite(blob.decode(), peer["package"]).encode() if peer.get("package") else blob


def record(git_dir: Path, manifest: dict) -> dict:
    """The manifest with each peer's files (its roots' import closure for a package, else its listed paths) and
    their hashes, read from the clone at the peer's commit."""
    peers = []
    for peer in manifest["peers"]:
        commit = peer["commit"]
        if peer.get("package"):
            modules = package_modules(git_dir, commit)
            read = lambda m, c=commit: git_show(git_dir, c, f"{PACKAGE_PREFIX}{m}.py").decode()  # noqa: E731
            paths = [f"{PACKAGE_PREFIX}{m}.py" for m in import_closure(read, peer["roots"], modules)]
        else:
            paths = peer["roots"]
        files = []
        for path in paths:
            blob = git_show(git_dir, commit, path)
            if blob is None:
                raise PeersMissing(f"peers: {path} is not in commit {commit} of {git_dir}")
            data = assembled_bytes(peer, blob)
            files.append({"path": path, "blob_sha256": sha256(blob), "sha256": sha256(data), "bytes": len(data)})
        peers.append({**peer, "files": files})
    return {**manifest, "peers": peers}


def assemble(git_dir: Path, manifest: dict, out: Path) -> int:
    """Writes every manifest file from the clone into `out` (the blob's sha256 checked first, then the assembled
    file's); the bytes written. PeersMissing names the first file whose commit or hash does not match."""
    written = 0
    for peer in manifest["peers"]:
        for f in peer["files"]:
            blob = git_show(git_dir, peer["commit"], f["path"])
            if blob is None:
                raise PeersMissing(f"peers: {f['path']} is not in commit {peer['commit']} of {git_dir} "
                                   f"(fetch {peer['ref']} of https://github.com/{manifest['upstream']})")
            if sha256(blob) != f["blob_sha256"]:
                raise PeersMissing(f"peers: {peer['commit']}:{f['path']} has sha256 {sha256(blob)}, the manifest "
                                   f"{f['blob_sha256']}")
            data = assembled_bytes(peer, blob)
            dest = out / target_path(peer, f["path"])
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
            written += len(data)
    problems = check(out, manifest)
    if problems:
        raise PeersMissing(problems[0])
    return written


def check(out: Path, manifest: dict) -> list[str]:
    """One line per file of `out` that is missing or differs from the manifest, and per stray module in a package."""
    problems = []
    if not out.is_dir():
        return [f"peers: {out} is missing: assemble it with `python3 bench/peer_sources.py assemble --git <clone>` "
                f"(a clone of https://github.com/{manifest['upstream']} with {', '.join(p['ref'] for p in manifest['peers'])})"]
    for peer in manifest["peers"]:
        expected = {target_path(peer, f["path"]): f for f in peer["files"]}
        for rel, f in expected.items():
            path = out / rel
            if not path.is_file():
                problems.append(f"peers: {path} is missing (the manifest's {peer['name']} {f['path']} at {peer['commit'][:12]}): "
                                "re-assemble with `python3 bench/peer_sources.py assemble --git <clone>`")
            elif (digest := sha256(path.read_bytes())) != f["sha256"]:
                problems.append(f"peers: {path} has sha256 {digest}, the manifest {f['sha256']} ({peer['name']} {f['path']} "
                                f"at {peer['commit'][:12]}): re-assemble with `python3 bench/peer_sources.py assemble --git <clone>`")
        if peer.get("package") and (out / peer["package"]).is_dir():
            stray = sorted(p.name for p in (out / peer["package"]).glob("*.py") if Path(peer["package"]) / p.name not in expected)
            if stray:  # a module the manifest does not name would import as the peer's own
                problems.append(f"peers: {out / peer['package']} holds {', '.join(stray)}, which the manifest does not name")
    return problems


def load_manifest(path: Path = MANIFEST) -> dict:
    return json.loads(path.read_text())


def require(out: Path | None = None, manifest: dict | None = None) -> dict:
    """The manifest, once `out` (default .peers/) matches it (and `out` first on sys.path, so the peers' packages
    import); else PeersMissing with the first problem."""
    out = PEERS_DIR if out is None else out
    manifest = load_manifest() if manifest is None else manifest
    problems = check(out, manifest)
    if problems:
        raise PeersMissing(problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
    if str(out) not in sys.path:
        sys.path.insert(0, str(out))
    return manifest


def peer(manifest: dict, name: str) -> dict:
    """A peer's entry by name."""
    return next(p for p in manifest["peers"] if p["name"] == name)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("assemble", "check", "record"))
    parser.add_argument("--git", type=Path, help="a clone of the upstream repository holding the peers' commits")
    parser.add_argument("--out", type=Path, default=None, help="default: .peers/ at the repository root")
    parser.add_argument("--manifest", type=Path, default=MANIFEST)
    args = parser.parse_args(argv)
    manifest = load_manifest(args.manifest)
    args.out = PEERS_DIR if args.out is None else args.out
    try:
        if args.action == "check":
            require(args.out, manifest)
            print(f"peers: {args.out} matches {args.manifest.name} "
                  f"({sum(len(p['files']) for p in manifest['peers'])} files)")
            return 0
        if args.git is None:
            parser.error(f"{args.action} needs --git <clone>")
        if args.action == "record":
            args.manifest.write_text(json.dumps(record(args.git, manifest), indent=1) + "\n")
            print(f"peers: wrote {args.manifest}")
            return 0
        written = assemble(args.git, manifest, args.out)
    except PeersMissing as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"peers: assembled {written} bytes into {args.out}")
    if written > MAX_BYTES:
        print(f"error: peers: {written} bytes is more than the {MAX_BYTES} carried with the tree", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
