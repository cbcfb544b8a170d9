"""Micro-benchmark of the STOMP frame codec (not a test).

Parses 200,000 SEND frames (4 headers, 100-byte bodies) fed in 64 KiB chunks,
then encodes as many MESSAGE frames, and prints the rates.

    python bench/codec_speed.py [--frames N] [--crlf] [--no-length]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere

from qmq.stomp.frame import StompParser, encode_frame  # noqa: E402

CHUNK = 64 * 1024


def make_stream(count: int, crlf: bool, with_length: bool, unique: bool = False) -> bytes:
    """
    @param count: how many SEND frames.
    @param crlf: end lines with CRLF instead of LF.
    @param with_length: give each frame a content-length header.
    @param unique: give each frame its own receipt id, so that no two header
        blocks are the same (the parser reuses the parse of a repeated one).
    @return: the frames, concatenated, each followed by an EOL heart-beat.
    """
    body = b"x" * 100
    headers = {
        "destination": "/queue/bench",
        "content-type": "text/plain",
        "receipt": "r-1234",
        "persistent": "true",
    }
    if with_length:
        headers["content-length"] = "100"
    frames = []
    for i in range(count if unique else 1):
        if unique:
            headers["receipt"] = f"r-{i}"
        frame = encode_frame("SEND", headers, body, "1.2") + b"\n"
        if crlf:
            head, sep, rest = frame.partition(b"\n\n")
            frame = head.replace(b"\n", b"\r\n") + b"\r\n\r\n" + rest
        frames.append(frame)
    return b"".join(frames) if unique else frames[0] * count


def bench_parse(stream: bytes, count: int) -> float:
    """
    @return: frames parsed per second.
    """
    chunks = [stream[i : i + CHUNK] for i in range(0, len(stream), CHUNK)]
    parser = StompParser()
    parser.version = "1.2"
    got = 0
    start = time.process_time()
    for chunk in chunks:
        got += len(parser.feed(chunk))
    elapsed = time.process_time() - start
    assert got == count, (got, count)
    return count / elapsed


def bench_encode(count: int) -> float:
    """
    @return: MESSAGE frames encoded per second.
    """
    body = b"x" * 100
    start = time.process_time()
    for i in range(count):
        encode_frame(
            "MESSAGE",
            {
                "subscription": "sub-0",
                "message-id": str(i),
                "destination": "/queue/bench",
                "content-type": "text/plain",
            },
            body,
        )
    return count / (time.process_time() - start)


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--frames", type=int, default=200_000)
    options.add_argument("--crlf", action="store_true", help="CRLF line endings")
    options.add_argument("--no-length", action="store_true", help="NUL-terminated bodies")
    options.add_argument("--unique", action="store_true", help="no two header blocks alike")
    options.add_argument("--rounds", type=int, default=3, help="best of N")
    args = options.parse_args()
    stream = make_stream(args.frames, args.crlf, not args.no_length, args.unique)
    parse = max(bench_parse(stream, args.frames) for _ in range(args.rounds))
    encode = max(bench_encode(args.frames) for _ in range(args.rounds))
    mib = len(stream) / args.frames * parse / 2**20
    print(f"parse:  {parse:>10,.0f} frames/s  ({mib:.0f} MiB/s, {1e6 / parse:.2f} us/frame)")
    print(f"encode: {encode:>10,.0f} frames/s  ({1e6 / encode:.2f} us/frame)")


if __name__ == "__main__":
    main()
