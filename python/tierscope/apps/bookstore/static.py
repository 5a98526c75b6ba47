"""The bookstore's static content for nginx: `write_static(root, items)` writes the document root

    root/tpcw/img/<name>.gif                  the 13 static GIFs of the original (pages.STATIC_GIFS)
    root/tpcw/img/img{i % 100}/thumb_{i}.gif  one thumbnail per item (5 KB)
    root/tpcw/img/img{i % 100}/image_{i}.gif  one full image per item, sized by i mod 100:
                                              1 % 250 KB, 4 % 100 KB, 15 % 50 KB, 35 % 10 KB, 45 % 5 KB

(research note phase2-workloads §1.1, the TPC-W `populate_images` rule). Every file is a valid
GIF89a (a 1x1 image in a logical screen of the stated size) padded to its byte size with comment
blocks, so a client downloads the bytes the original served.

Per-item files are HARD LINKS to one file per size class (under root/tpcw/img/classes/), for any
item count: the document root takes about 420 KB of disk whatever the scale, and writing it is
fast (about 10 µs per link: 2 s for 100 000 items, 20 s for a million). A filesystem's link limit
per inode (65 000 on ext4) is handled by starting a new copy of the class file when it is reached.
Re-running with the same root and item count does nothing (a marker file records what is there).
"""

from __future__ import annotations

import errno
import os
import struct
from pathlib import Path

from tierscope.apps.bookstore.pages import STATIC_GIFS

KB = 1024
THUMB_BYTES = 5 * KB
#: (upper bound of i mod 100, exclusive, size in bytes) of the full images
IMAGE_CLASSES = ((1, 250 * KB), (5, 100 * KB), (20, 50 * KB), (55, 10 * KB), (100, 5 * KB))
STATIC_SIZES = {"tpclogo": 4 * KB}  # the buttons and banners: 1 KB unless named here


def image_bytes(i: int) -> int:
    """The size of item `i`'s full image."""
    m = i % 100
    for bound, size in IMAGE_CLASSES:
        if m < bound:
            return size
    raise AssertionError(m)


def gif(size: int, width: int = 1, height: int = 1) -> bytes:
    """A valid GIF89a of exactly `size` bytes (>= 64): a 1x1 black pixel in a `width` x `height`
    logical screen, padded with comment-extension sub-blocks."""
    head = b"GIF89a" + struct.pack("<HHBBB", width, height, 0x80, 0, 0) + b"\x00\x00\x00\xff\xff\xff"
    image = b"\x2c" + struct.pack("<HHHHB", 0, 0, 1, 1, 0) + b"\x02\x02\x44\x01\x00"
    tail = b"\x3b"
    room = size - len(head) - len(image) - len(tail) - 3  # 3: comment introducer (2) + terminator (1)
    if room < 2:
        raise ValueError(f"gif: {size} bytes is too small")
    blocks = []
    while room > 0:
        take = min(256, room)
        if room - take == 1:  # a lone byte cannot be a sub-block (it would be the terminator)
            take -= 1
        blocks.append(bytes([take - 1]) + b"c" * (take - 1))
        room -= take
    out = head + b"\x21\xfe" + b"".join(blocks) + b"\x00" + image + tail
    assert len(out) == size, (len(out), size)
    return out


class _Linker:
    """Hard links to one source file per class, making a new copy when the link limit is hit."""

    def __init__(self, directory: Path, name: str, data: bytes):
        self.directory, self.name, self.data = directory, name, data
        self.copies = 0
        self.source = self._new_copy()

    def _new_copy(self) -> Path:
        path = self.directory / f"{self.name}.{self.copies}.gif"
        self.copies += 1
        path.write_bytes(self.data)
        return path

    def link(self, target: Path) -> None:
        try:
            os.link(self.source, target)
        except FileExistsError:
            if target.stat().st_size != len(self.data):
                target.unlink()
                self.link(target)
        except OSError as err:
            if err.errno != errno.EMLINK:
                raise
            self.source = self._new_copy()
            os.link(self.source, target)


def write_static(root: str | Path, items: int = 100_000) -> Path:
    """Write the document root for a store of `items` items under `root`; return `root`."""
    if items < 1:
        raise ValueError(f"items: expected >= 1, got {items}")
    root = Path(root)
    img = root / "tpcw" / "img"
    marker = img / "classes" / f".complete-{items}"
    if marker.exists():
        return root
    classes = img / "classes"
    classes.mkdir(parents=True, exist_ok=True)
    for name in STATIC_GIFS:
        (img / f"{name}.gif").write_bytes(gif(STATIC_SIZES.get(name, KB), 120, 40))
    for k in range(100):
        (img / f"img{k}").mkdir(exist_ok=True)
    thumbs = _Linker(classes, "thumb", gif(THUMB_BYTES, 100, 150))
    images = {size: _Linker(classes, f"image{size // KB}k", gif(size, 300, 450)) for _, size in IMAGE_CLASSES}
    for i in range(1, items + 1):
        d = img / f"img{i % 100}"
        thumbs.link(d / f"thumb_{i}.gif")
        images[image_bytes(i)].link(d / f"image_{i}.gif")
    for old in classes.glob(".complete-*"):
        old.unlink()
    marker.write_text(f"{items} items\n")
    return root
