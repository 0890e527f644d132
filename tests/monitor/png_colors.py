"""Counts pixels of given colours in the top and bottom half of a PNG, decoded with
the standard library alone (zlib; 8-bit RGB or RGBA, every PNG filter), so the
tests can check `keel plot --out FILE.png` draws what its SVG says.

usage: png_colors.py FILE.png RRGGBB...  ->  "WIDTH HEIGHT" then "RRGGBB TOP BOTTOM" per colour
"""
import struct, sys, zlib
def read_png(path):
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, hdr = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR": hdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT": idat += body
    w, h, depth, ctype = hdr[:4]
    assert depth == 8 and ctype in (2, 6), hdr
    bpp = 3 if ctype == 2 else 4
    raw, stride, rows, prev = zlib.decompress(idat), w * bpp, [], bytearray(w * bpp)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1: line[i] = (line[i] + a) & 255
            elif f == 2: line[i] = (line[i] + b) & 255
            elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c; pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line); prev = line
    return w, h, bpp, rows
def count(img, rgb, y0, y1, tol=24):
    w, h, bpp, rows = img
    n = 0
    for y in range(int(y0 * h), int(y1 * h)):
        r = rows[y]
        for x in range(w):
            if all(abs(r[x * bpp + k] - rgb[k]) <= tol for k in range(3)): n += 1
    return n
img = read_png(sys.argv[1])
print(img[0], img[1])
for hexrgb in sys.argv[2:]:
    rgb = tuple(int(hexrgb[k:k + 2], 16) for k in (0, 2, 4))
    print(hexrgb, count(img, rgb, 0, 0.5), count(img, rgb, 0.5, 1))
