#!/usr/bin/env python3
"""Checks a browser screenshot (PNG) for the report's browser test, with the standard library only.

Usage: png_check.py FILE WIDTH HEIGHT [--colour RRGGBB]...

Passes (exit 0) when the image is WIDTH x HEIGHT, is not blank (at least 16 distinct colours and
at least 2% of its pixels off the background, the most common colour) and, for each --colour,
holds pixels of exactly that colour (a colour the page draws with, so that its styles and charts
rendered). Prints what it measured either way.
"""
import struct
import sys
import zlib


def decode_png(path):
    """Returns (width, height, rows of pixel tuples) of an 8-bit RGB or RGBA PNG."""
    data = open(path, 'rb').read()
    if data[:8] != b'\x89PNG\r\n\x1a\n':
        raise ValueError(f'{path}: not a PNG file')
    pos, idat, width, height, channels = 8, b'', 0, 0, 0
    while pos < len(data):
        (length,) = struct.unpack('>I', data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b'IHDR':
            width, height, depth, colour_type, _, _, interlace = struct.unpack('>IIBBBBB', body)
            if depth != 8 or colour_type not in (2, 6) or interlace:
                raise ValueError(f'{path}: unsupported PNG (depth {depth}, type {colour_type}, '
                                 f'interlace {interlace})')
            channels = 3 if colour_type == 2 else 4
        elif kind == b'IDAT':
            idat += body
    raw = zlib.decompress(idat)
    stride = width * channels
    rows, prev, p = [], bytearray(stride), 0
    for _ in range(height):
        kind, line = raw[p], bytearray(raw[p + 1:p + 1 + stride])
        p += 1 + stride
        # The five PNG row filters (None, Sub, Up, Average, Paeth).
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
                line[i] = (line[i] + pred) & 255
        rows.append(bytes(line))
        prev = line
    pixels = [[row[i:i + 3] for i in range(0, stride, channels)] for row in rows]
    return width, height, pixels


def main(argv):
    if len(argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    path, want_w, want_h = argv[1], int(argv[2]), int(argv[3])
    colours = [bytes.fromhex(c) for flag, c in zip(argv[4::2], argv[5::2]) if flag == '--colour']
    width, height, pixels = decode_png(path)
    counts = {}
    for row in pixels:
        for px in row:
            counts[px] = counts.get(px, 0) + 1
    total = width * height
    background, most = max(counts.items(), key=lambda kv: kv[1])
    off = 1 - most / total
    print(f'{path}: {width}x{height}, {len(counts)} colours, {100 * off:.1f}% off the background '
          f'#{background.hex()}')
    ok = True
    if (width, height) != (want_w, want_h):
        print(f'FAIL: expected {want_w}x{want_h}')
        ok = False
    if len(counts) < 16 or off < 0.02:
        print('FAIL: the screenshot is (nearly) blank')
        ok = False
    for c in colours:
        n = counts.get(c, 0)
        print(f'#{c.hex()}: {n} pixels')
        if n == 0:
            print(f'FAIL: no pixel of #{c.hex()}')
            ok = False
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main(sys.argv))
