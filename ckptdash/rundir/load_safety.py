"""Whether loading a directory checkpoint can run code: the last check of the resume rule.

A single-file checkpoint is loaded by :meth:`ckptdash.Monitor.load` with
``torch.load(weights_only=True)``, which rebuilds tensors and plain data only. A directory
checkpoint is loaded by its framework's own code, and two of those unpickle:

* **DCP** (``torch.distributed.checkpoint``): ``dcp.load`` unpickles ``.metadata`` with
  :func:`pickle.load`, and every non-tensor value of the state dict (a BYTE_IO item in a
  ``.distcp`` shard) with ``torch.load(weights_only=False)``. A directory holding
  ``.metadata`` is accepted only when ``.metadata`` unpickles under :class:`DcpMetadataUnpickler`
  (the classes DCP itself writes, nothing else) and every BYTE_IO item loads with
  ``torch.load(weights_only=True)``: then the loads ``dcp.load`` does meet the same few
  harmless constructors. A DCP directory holding other files too (Lightning's ``meta.pt``)
  must also pass the rule below, since another loader reads those.
* **any other directory** (Accelerate's ``checkpoint_N`` with its ``custom_checkpoint_*.pkl``
  and RNG states, a Hugging Face ``checkpoint-N``): its loaders are the framework's, so the
  rule is about who could have written it. Every file and folder in it must belong to the
  job's user (this process's effective uid) and none may be a link; a file that the group or
  others may write counts only when the owner's own manifest pins its bytes (the manifest is
  the job user's, not writable by others, and the resume rule checked every file's checksum
  against it).

Each answer is None (safe to load) or the reason, which the resume rule reports as a skipped
candidate. Nothing here follows a link or runs code from the checkpoint.
"""

from __future__ import annotations

import io
import os
import pickle
import stat
from pathlib import Path
from typing import Any, Final

from ckptdash.rundir.manifest import MANIFEST_NAME

DCP_METADATA: Final = ".metadata"
MAX_METADATA_BYTES: Final = 512 << 20
"""A ``.metadata`` larger than this is not read (DCP's for a 70B model is a few MB)."""
MAX_ITEM_BYTES: Final = 256 << 20
"""A non-tensor value of the state dict larger than this is not checked, and so refused."""

_DCP_CLASSES: Final = {
    "torch.distributed.checkpoint.metadata": frozenset(
        {
            "Metadata",
            "StorageMeta",
            "MetadataIndex",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "TensorProperties",
            "_MEM_FORMAT_ENCODING",
        }
    ),
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    "torch.serialization": frozenset({"_get_layout"}),
    "torch": frozenset({"Size"}),
    "pathlib": frozenset({"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"}),
    "collections": frozenset({"OrderedDict"}),
}
"""What torch 2.13's DCP pickles into ``.metadata`` (found by tracing ``find_class`` over real
saves: torch/distributed/checkpoint/metadata.py and filesystem.py), plus torch's dtypes."""


class DcpMetadataUnpickler(pickle.Unpickler):
    """Unpickles a DCP ``.metadata``; any other global raises :class:`pickle.UnpicklingError`."""

    def find_class(self, module: str, name: str) -> Any:
        if name in _DCP_CLASSES.get(module, ()):
            return super().find_class(module, name)
        if module == "torch":
            import torch

            value = getattr(torch, name, None)
            if isinstance(value, torch.dtype):
                return value
        raise pickle.UnpicklingError(f"{module}.{name} is not a class DCP writes")


def dcp_refusal(path: str | os.PathLike[str]) -> str | None:
    """Why ``dcp.load`` of the DCP directory ``path`` could run code, or None."""
    root = Path(path)
    data = _read_regular(root / DCP_METADATA, MAX_METADATA_BYTES)
    if isinstance(data, str):
        return f"DCP {DCP_METADATA}: {data}"
    try:
        metadata = DcpMetadataUnpickler(io.BytesIO(data)).load()
    except Exception as exc:  # any decoder failure on untrusted bytes is a refusal
        return (
            f"DCP {DCP_METADATA} needs more than DCP's own classes to load ({exc}); refused:"
            " loading it could run code"
        )
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata

    if not isinstance(metadata, Metadata):
        return f"DCP {DCP_METADATA} holds a {type(metadata).__name__}, not DCP's Metadata"
    storage = metadata.storage_data if isinstance(metadata.storage_data, dict) else {}
    for index, info in storage.items():
        fqn = str(getattr(index, "fqn", ""))
        item = metadata.state_dict_metadata.get(fqn)
        if isinstance(item, BytesStorageMetadata) and (why := _byte_item_refusal(root, info)):
            return f"DCP value {fqn!r}: {why}"
    return None


def only_dcp_files(path: str | os.PathLike[str]) -> bool:
    """Whether the directory holds nothing but what DCP writes (``.metadata``, ``*.distcp``)
    and ckptdash's manifest: any other file is read by some other loader (Lightning's
    ``meta.pt``), so :func:`directory_refusal` applies to the directory as well."""
    try:
        with os.scandir(path) as it:
            names = [e.name for e in it]
    except OSError:
        return False
    return all(n in (DCP_METADATA, MANIFEST_NAME) or n.endswith(".distcp") for n in names)


def _byte_item_refusal(root: Path, info: Any) -> str | None:
    """A BYTE_IO item (what ``dcp.load`` hands to ``torch.load(weights_only=False)``)."""
    import torch

    rel = str(getattr(info, "relative_path", ""))
    offset, length = getattr(info, "offset", -1), getattr(info, "length", -1)
    if getattr(info, "transform_descriptors", None):
        return "stored through a transform ckptdash cannot check; refused"
    if (
        not rel
        or os.path.isabs(rel)
        or ".." in Path(rel).parts
        or not isinstance(offset, int)
        or not isinstance(length, int)
        or offset < 0
        or not 0 <= length <= MAX_ITEM_BYTES
    ):
        return f"stored at {rel!r} [{offset}, +{length}]: not a place in this checkpoint"
    data = _read_regular(root / rel, MAX_ITEM_BYTES, span=(offset, length))
    if isinstance(data, str):
        return data
    try:
        torch.load(io.BytesIO(data), weights_only=True)
    except Exception as exc:  # a failure to load safely is a refusal, whatever it is
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"does not load with weights_only=True ({first[:200]}); loading it could run code"
    return None


def directory_refusal(
    path: str | os.PathLike[str], *, checksums_verified: bool, uid: int | None = None
) -> str | None:
    """Why another account could have written the checkpoint directory ``path``, or None.

    ``checksums_verified``: the resume rule checked every file against the manifest
    (checksum mode, a recorded digest); then a file others may write still counts when the
    manifest itself is the job user's and only they may write it.
    """
    me = os.geteuid() if uid is None else uid
    root = Path(path)
    pinned = checksums_verified and _owned_and_private(root / MANIFEST_NAME, me)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in [*dirnames, *filenames]:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            try:
                st = os.lstat(full)
            except OSError as exc:
                return f"{rel}: cannot look at it: {exc.strerror}"
            if stat.S_ISLNK(st.st_mode):
                return f"{rel} is a symbolic link: refused (it could point anywhere)"
            if st.st_uid != me:
                return (
                    f"{rel} belongs to uid {st.st_uid}, not to the job's user (uid {me}):"
                    " another account wrote it, and loading it could run their code"
                )
            if stat.S_ISREG(st.st_mode) and st.st_mode & 0o022 and not pinned:
                return (
                    f"{rel} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
                    " and no manifest of yours pins its bytes: refused, loading it could run"
                    f" their code; `chmod -R go-w {root}` if you trust them"
                )
    return None


def _owned_and_private(path: Path, uid: int) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o022


def _read_regular(path: Path, cap: int, *, span: tuple[int, int] | None = None) -> bytes | str:
    """The whole regular file (at most ``cap`` bytes), or bytes ``span`` = (offset, length) of
    it; never following a link nor blocking. A string says why not."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        return f"cannot open it: {exc.strerror} (a link, or missing)"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return "not a regular file"
        if span is None:
            if st.st_size > cap:
                return f"{st.st_size} bytes, over the {cap}-byte limit; not read"
            offset, length = 0, st.st_size
        else:
            offset, length = span
            if offset + length > st.st_size:
                return f"{path.name} ends before where DCP says the value is"
        data = os.pread(fd, length, offset)
        return data if len(data) == length else f"{path.name} changed while being read"
    except OSError as exc:
        return f"cannot read it: {exc.strerror}"
    finally:
        os.close(fd)
