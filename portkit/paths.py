"""The one rule for which paths a patch may name in a tree.

A patch series is untrusted input: whatever it says, no patch may reach outside the tree,
into git's own files or into portkit's record. A path is refused when it is absolute, has
an empty, `.` or `..` component or a NUL byte, or when a component is one git treats as its
own: `.git` in any case, and the spellings Windows and macOS file systems take for it
(`.git ` and `.git.` with trailing spaces or dots, an NTFS stream `.git::$INDEX_ALLOCATION`,
the 8.3 short name `git~1`, `.git` with characters HFS+ ignores such as U+200C), as git's
verify_path refuses them; the same for `.portkit`, where portkit keeps its record and
journal. Files such as `.gitmodules` or `.gitattributes` are ordinary files, except as
symbolic links, which git refuses too. A symbolic link's target is held to the same rule,
taken from the link's folder.

series.py applies the rule when a series is read, and transaction.py again at the last write
boundary, so that a path that slipped past the first is still never written.
"""

from __future__ import annotations

import posixpath

RECORD_FOLDER = ".portkit"
# git's modes of a file: what a patch's mode lines say and what a tree's files are
REGULAR, EXECUTABLE, SYMLINK = 0o100644, 0o100755, 0o120000

# Code points HFS+ ignores when it compares names (git's is_hfs_dotgit skips them too).
_HFS_IGNORED = frozenset([*range(0x200C, 0x2010), *range(0x202A, 0x202F),
                          *range(0x206A, 0x2070), 0xFEFF])
_OWNED = {".git": "git's own folder", "git~1": "git's own folder (its short name)",
          RECORD_FOLDER: "portkit's record", "portki~1": "portkit's record (its short name)"}
# Files git reads as its configuration when they sit in the work tree: never as links.
_NO_LINK = (".gitmodules", ".gitattributes", ".gitignore", ".mailmap")


def _plain(component: str) -> str:
    """A component as a case-insensitive, HFS+ and NTFS file system sees it."""
    name = "".join(c for c in component if ord(c) not in _HFS_IGNORED).casefold()
    return name.split(":", 1)[0].rstrip(" .")  # `:stream`, trailing spaces and dots


def owner_of(component: str) -> str | None:
    """Whose a path component is when git or portkit keeps its own files there."""
    return _OWNED.get(_plain(component))


def path_problem(rel: str) -> str | None:
    """Why a patch may not name `rel` (a path relative to the tree), or None when it may."""
    if not rel:
        return "an empty path"
    if "\0" in rel:
        return "a NUL byte in the path"
    if rel.startswith("/"):
        return "an absolute path (a patch names files inside the tree)"
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "a path with an empty, `.` or `..` component"
    for part in parts:
        for piece in part.split("\\"):  # a folder separator on Windows
            owner = owner_of(piece)
            if owner is not None:
                return f"{piece!r} is {owner}: no patch may touch it"
    return None


def link_problem(link: str, target: str) -> str | None:
    """Why a patch may not make `link` (a tree path) a symbolic link to `target`, or None."""
    base = posixpath.basename(link)
    if _plain(base) in _NO_LINK:
        return f"{base} may not be a symbolic link (git refuses it)"
    if not target or "\0" in target or "\n" in target:
        return "a symbolic link without a plain target"
    if target.startswith("/"):
        return f"a symbolic link to {target!r}, outside the tree"
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(link), target))
    if resolved == ".":
        return None
    if resolved == ".." or resolved.startswith("../"):
        return f"a symbolic link to {target!r}, outside the tree"
    problem = path_problem(resolved)
    return f"a symbolic link to {target!r}: {problem}" if problem else None
