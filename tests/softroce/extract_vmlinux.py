"""extract_vmlinux.py VMLINUZ OUT: writes the ELF kernel inside a Debian bzImage.

Debian compresses the kernel with xz; qemu can boot the ELF directly (PVH entry), which
under software emulation saves the ~1 minute the in-guest decompressor takes.
"""
import lzma
import sys

XZ_MAGIC = b"\xfd7zXZ\x00"


def main(src, dst):
    data = open(src, "rb").read()
    start = data.find(XZ_MAGIC)
    if start < 0:
        sys.exit(f"{src}: no xz stream (not an xz-compressed bzImage)")
    elf = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data[start:])
    if not elf.startswith(b"\x7fELF"):
        sys.exit(f"{src}: the xz stream is not an ELF kernel")
    with open(dst, "wb") as f:
        f.write(elf)


if __name__ == "__main__":
    main(*sys.argv[1:3])
