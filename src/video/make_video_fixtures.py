#!/usr/bin/python3
"""Makes the video fixtures of src/video/video_decoder_test.cc with Debian's
ffmpeg CLI, plus hand-edited copies that lie or break in known ways.

Usage: make_video_fixtures.py OUT_DIR [FFMPEG]

Writes into OUT_DIR:
  h264.mp4          testsrc 160x120, 20 frames at 10 fps, libx264 yuv420p,
                    moov first (+faststart)
  h264_moov_end.mp4 the same with the moov box after mdat (ffmpeg's default)
  vp9.webm          testsrc 160x120, 12 frames at 12 fps, libvpx-vp9
  mpeg4.avi         testsrc 96x64, 8 frames at 8 fps, MPEG-4 part 2 in AVI
  audio.wav         one second of sine, no video stream
  lossless.mkv      testsrc 168x112, 20 frames at 10 fps, FFV1 RGB (lossless)
  lossless_frame13.png  frame 13 of lossless.mkv, extracted by ffmpeg
  truncated.mp4     h264.mp4 cut in the middle of mdat (header intact)
  truncated_moov.mp4  h264_moov_end.mp4 cut before its moov
  zero_frames.y4m   a YUV4MPEG2 header with no FRAME
  huge.y4m          a YUV4MPEG2 header claiming 10000x10000 and one tiny frame
  invalid_size.y4m  a YUV4MPEG2 header claiming 100000x100000 (FFmpeg refuses it)
  huge_stsd.mp4     h264.mp4 with the avc1 sample entry claiming 65535x65535
  ten_hours.mp4     h264.mp4 whose mvhd and mdhd claim 36000 s
  unknown_codec.mp4 h264.mp4 whose sample entry type avc1 is renamed zzzz
  garbage.bin       4 KiB of a fixed pseudo-random pattern
Rotation (docs/VIDEO.md), all lossless RGB H.264 (libx264rgb -qp 0) of
testsrc 168x112, 8 frames at 10 fps, so decoded pixels are exact:
  rgb.mp4           no display matrix
  rgb_rot90.mp4, rgb_rot180.mp4, rgb_rot270.mp4
                    rgb.mp4 remuxed with -metadata:s:v rotate=N (the tkhd
                    matrix; FFmpeg reads rotate=90 as 90 degrees
                    counterclockwise, av_display_rotation_get 90)
  rgb_hflip.mp4     rgb.mp4 whose tkhd matrix mirrors x (a horizontal flip)
  rgb_rot45.mp4     rgb.mp4 whose tkhd matrix turns by 45 degrees
  rgb_sei90.mkv     rgb.mp4's stream with an H.264 display-orientation SEI
                    of 90 degrees (h264_metadata) and no container matrix
  <name>_frame5.png frame 5 of each MP4 as ffmpeg's own autorotate shows it
  rgb_sei90_frame0.png  frame 0 of rgb_sei90.mkv, likewise
"""
import math
import os
import struct
import subprocess
import sys


def ffmpeg(exe, *args):
    subprocess.run([exe, "-v", "error", "-nostdin", "-y", *args], check=True)


def find_box(data, path, start=0, end=None):
    """Offset of the box at `path` (e.g. ["moov", "trak", "mdia", "mdhd"]):
    the offset of its 4-byte size field. Walks containers only."""
    end = len(data) if end is None else end
    pos = start
    while pos + 8 <= end:
        size, kind = struct.unpack(">I4s", data[pos:pos + 8])
        header = 8
        if size == 1:
            size = struct.unpack(">Q", data[pos + 8:pos + 16])[0]
            header = 16
        elif size == 0:
            size = end - pos
        if kind.decode("latin-1") == path[0]:
            if len(path) == 1:
                return pos
            return find_box(data, path[1:], pos + header, pos + size)
        pos += size
    raise ValueError("box %s not found" % "/".join(path))


def patch_duration(data, box_path, seconds):
    """Sets a version-0 mvhd/mdhd duration to `seconds` of its timescale."""
    pos = find_box(data, box_path)
    body = pos + 8
    assert data[body] == 0, "version 1 box not handled"
    timescale = struct.unpack(">I", data[body + 12:body + 16])[0]
    data[body + 16:body + 20] = struct.pack(">I", timescale * seconds)


def set_track_matrix(data, matrix):
    """Writes a version-0 tkhd's 3x3 matrix (9 int32: a b u c d v x y w;
    16.16 fixed point, u v w 2.30)."""
    pos = find_box(data, ["moov", "trak", "tkhd"])
    body = pos + 8
    assert data[body] == 0, "version 1 tkhd not handled"
    # version/flags 4, creation/modification/track_ID/reserved/duration 20,
    # reserved 8, layer/alternate_group/volume/reserved 8, then the matrix.
    off = body + 4 + 20 + 8 + 8
    data[off:off + 36] = struct.pack(">9i", *matrix)


def make_rotation_fixtures(exe, p):
    ffmpeg(exe, "-f", "lavfi", "-i", "testsrc=size=168x112:rate=10", "-frames:v", "8", "-c:v", "libx264rgb", "-qp",
           "0", "-pix_fmt", "rgb24", p("rgb.mp4"))
    names = ["rgb"]
    for deg in (90, 180, 270):
        ffmpeg(exe, "-i", p("rgb.mp4"), "-c", "copy", "-metadata:s:v", f"rotate={deg}", p(f"rgb_rot{deg}.mp4"))
        names.append(f"rgb_rot{deg}")
    one, unit = 1 << 16, 1 << 30
    base = open(p("rgb.mp4"), "rb").read()
    c45 = int(round(math.cos(math.pi / 4) * one))
    for name, matrix in (("rgb_hflip", [-one, 0, 0, 0, one, 0, 168 * one, 0, unit]),
                         ("rgb_rot45", [c45, -c45, 0, c45, c45, 0, 0, 0, unit])):
        data = bytearray(base)
        set_track_matrix(data, matrix)
        open(p(name + ".mp4"), "wb").write(data)
    names.append("rgb_hflip")
    ffmpeg(exe, "-i", p("rgb.mp4"), "-c", "copy", "-bsf:v", "h264_metadata=display_orientation=insert:rotate=90",
           p("rgb_sei90.mkv"))
    for name in names:
        ffmpeg(exe, "-i", p(name + ".mp4"), "-vf", r"select=eq(n\,5)", "-frames:v", "1", "-pix_fmt", "rgb24",
               p(name + "_frame5.png"))
    # The SEI rides on the first frame only, and ffmpeg turns only the frames
    # that carry it (the rest it scales back to the first one's size): its
    # frame 0 is the reference.
    ffmpeg(exe, "-i", p("rgb_sei90.mkv"), "-frames:v", "1", "-pix_fmt", "rgb24", p("rgb_sei90_frame0.png"))


def sample_entry(data):
    """Offset of the first sample entry (its size field) inside stsd."""
    stsd = find_box(data, ["moov", "trak", "mdia", "minf", "stbl", "stsd"])
    return stsd + 8 + 8  # full box header (4) + entry count (4)


def main():
    out = sys.argv[1]
    exe = sys.argv[2] if len(sys.argv) > 2 else "ffmpeg"
    os.makedirs(out, exist_ok=True)
    p = lambda name: os.path.join(out, name)

    src = ["-f", "lavfi", "-i", "testsrc=size=160x120:rate=10", "-frames:v", "20"]
    ffmpeg(exe, *src, "-c:v", "libx264", "-pix_fmt", "yuv420p", "-movflags", "+faststart", p("h264.mp4"))
    ffmpeg(exe, *src, "-c:v", "libx264", "-pix_fmt", "yuv420p", p("h264_moov_end.mp4"))
    ffmpeg(exe, "-f", "lavfi", "-i", "testsrc=size=160x120:rate=12", "-frames:v", "12", "-c:v", "libvpx-vp9",
           "-b:v", "300k", p("vp9.webm"))
    ffmpeg(exe, "-f", "lavfi", "-i", "testsrc=size=96x64:rate=8", "-frames:v", "8", "-c:v", "mpeg4", "-q:v", "3",
           p("mpeg4.avi"))
    ffmpeg(exe, "-f", "lavfi", "-i", "sine=duration=1", p("audio.wav"))
    ffmpeg(exe, "-f", "lavfi", "-i", "testsrc=size=168x112:rate=10", "-frames:v", "20", "-c:v", "ffv1", "-pix_fmt",
           "bgr0", p("lossless.mkv"))
    ffmpeg(exe, "-i", p("lossless.mkv"), "-vf", r"select=eq(n\,13)", "-frames:v", "1", "-pix_fmt", "rgb24",
           p("lossless_frame13.png"))

    mp4 = bytearray(open(p("h264.mp4"), "rb").read())
    mdat = find_box(mp4, ["mdat"])
    open(p("truncated.mp4"), "wb").write(mp4[:mdat + (len(mp4) - mdat) // 2])
    moov_end = open(p("h264_moov_end.mp4"), "rb").read()
    open(p("truncated_moov.mp4"), "wb").write(moov_end[:find_box(moov_end, ["moov"])])

    open(p("zero_frames.y4m"), "wb").write(b"YUV4MPEG2 W64 H48 F10:1 Ip A1:1 C420jpeg\n")
    open(p("huge.y4m"), "wb").write(b"YUV4MPEG2 W10000 H10000 F30:1 Ip A1:1 C420jpeg\nFRAME\n" + bytes(64))
    open(p("invalid_size.y4m"), "wb").write(b"YUV4MPEG2 W100000 H100000 F30:1 Ip A1:1 C420jpeg\nFRAME\n" + bytes(64))

    huge = bytearray(mp4)
    entry = sample_entry(huge)
    assert huge[entry + 4:entry + 8] == b"avc1"
    # VisualSampleEntry: 8 box header, 6 reserved, 2 data_reference_index,
    # 16 pre_defined/reserved, then width and height (16 bits each).
    huge[entry + 32:entry + 36] = struct.pack(">HH", 65535, 65535)
    open(p("huge_stsd.mp4"), "wb").write(huge)

    long = bytearray(mp4)
    patch_duration(long, ["moov", "mvhd"], 36000)
    patch_duration(long, ["moov", "trak", "mdia", "mdhd"], 36000)
    open(p("ten_hours.mp4"), "wb").write(long)

    unknown = bytearray(mp4)
    entry = sample_entry(unknown)
    unknown[entry + 4:entry + 8] = b"zzzz"
    open(p("unknown_codec.mp4"), "wb").write(unknown)

    make_rotation_fixtures(exe, p)

    state, junk = 12345, bytearray()
    for _ in range(4096):
        state = (state * 1103515245 + 12345) & 0x7FFFFFFF
        junk.append(state >> 16 & 0xFF)
    open(p("garbage.bin"), "wb").write(junk)


if __name__ == "__main__":
    main()
