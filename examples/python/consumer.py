#!/usr/bin/env python3
"""Consume a pgrelay queue with redis-py, following the public layout (docs/design.md section 4).

    python3 consumer.py --url redis://127.0.0.1:6379 --group my_app orders
    python3 consumer.py --url redis://127.0.0.1:6379 --dlq orders

The first form reads every shard of queue `orders` through the consumer group `my_app` and prints
each message as one JSON line, then acknowledges its stream entry (which may hold several). The
second prints the dead letters and exits.
See examples/README.md for what the example does and does not do.
"""

import argparse
import json
import signal
import sys
import time
from decimal import Decimal

import redis

RESCAN_SECONDS = 5  # how often the shard count is read again
LAYOUT_VERSIONS = ("1", "2", "3")  # the layout versions (meta `version`) this consumer reads


class Queue:
    """The key names of one queue (the hash tag {queue} puts them all in one cluster slot)."""

    def __init__(self, prefix, name):
        self.meta = f"{prefix}:{{{name}}}:meta"
        self.dlq = f"{prefix}:{{{name}}}:dlq"
        self._shard = f"{prefix}:{{{name}}}:s:"

    def shard(self, n):
        return f"{self._shard}{n}"


def text(v):
    return v.decode("utf-8") if isinstance(v, bytes) else v


def messages_of(fields):
    """The messages of a stream entry, each a dict with layout version 1's fields (off, p, id, tx,
    ts, h, d) and the entry's other fields (a dead letter's group, error, ...).

    An entry tells its layout by itself. Version 1: the seven fields. Version 2: `m`, a JSON object
    (off, p, id, tx, ts, and h when present), and `d`. Version 3: `m`, a JSON array of such objects
    in offset order, each with `len`, the byte length of its payload, and `d`, the payloads one
    after another: each message's payload is the next `len` bytes of d. m's members become the
    fields (h as JSON text, "" when absent)."""
    f = {text(k): v for k, v in fields.items()}
    if "m" not in f:
        return [f]  # version 1
    m, d = json.loads(f.pop("m")), f.pop("d")
    if isinstance(m, dict):
        m = [dict(m, len=len(d))]  # version 2: one message, all of d
    out, at = [], 0
    for x in m:
        out.append(dict(f, off=str(x["off"]), p=x["p"], id=x["id"], tx=x["tx"], ts=str(x["ts"]),
                        h=json.dumps(x["h"], separators=(",", ":")) if "h" in x else "",
                        d=d[at:at + x["len"]]))  # d is bytes: sliced by bytes
        at += x["len"]
    return out


def message(shard, entry_id, f):
    """One message of a queue entry (messages_of) as a dict. The payload `d` is kept as the exact
    text the producer wrote."""
    return {
        "shard": shard,
        "offset": int(f["off"]),
        "entry_id": text(entry_id),
        "id": text(f["id"]),
        "partition": text(f["p"]),
        "tx": text(f["tx"]),
        "created_at": int(f["ts"]),
        "header": text(f["h"]),
        "payload": text(f["d"]),
    }


def handle(msg):
    """The application's work. Here: decode the event and print the message as a JSON line.

    Decode with parse_float=Decimal: numeric columns keep every digit PostgreSQL printed (Python's
    int is exact already). Make this idempotent by `id` or by (shard, offset): after a crash the
    messages read but not yet acknowledged are delivered again.
    """
    event = json.loads(msg["payload"], parse_float=Decimal)
    _ = (event["op"], event.get("table"), event.get("key"))  # what an application would use
    print(json.dumps(msg), flush=True)


class Consumer:
    def __init__(self, r, queue, group, consumer, start, count, block_ms):
        self.r, self.q, self.group, self.consumer = r, queue, group, consumer
        self.start, self.count, self.block_ms = start, count, block_ms
        self.shards = 0  # 0: not set up yet
        self.checked = 0.0
        self.stopping = False

    def shard_count(self):
        """The queue's shard count (0 while it does not exist). A layout version this reader does
        not know (no `version` is 1) would be read wrongly: it stops instead."""
        shards, version = self.r.hmget(self.q.meta, "shards", "version")
        if version is not None and text(version) not in LAYOUT_VERSIONS:
            sys.exit(f"queue {self.q.meta}: layout version {text(version)}; this consumer reads "
                     f"versions {', '.join(LAYOUT_VERSIONS)}: upgrade it")
        return int(shards) if shards is not None else 0

    def setup(self, shards):
        """Create the group on every shard. A shard stream exists only once a producer wrote to it,
        so MKSTREAM creates an empty one; BUSYGROUP means the group is there already."""
        for n in range(shards):
            try:
                self.r.xgroup_create(self.q.shard(n), self.group, id=self.start, mkstream=True)
            except redis.ResponseError as e:
                if not str(e).startswith("BUSYGROUP"):
                    raise
        self.shards = shards
        self.checked = time.monotonic()
        self.drain_pending()

    def resync(self):
        """Read `shards` again (a queue deleted and created again may have another count) and set
        the group up on every shard; wait while the queue does not exist."""
        while not self.stopping:
            shards = self.shard_count()
            if shards > 0:
                if shards != self.shards:
                    print(f"queue {self.q.meta}: {shards} shards", file=sys.stderr, flush=True)
                self.setup(shards)
                return
            time.sleep(0.5)

    def read(self, ids, block):
        streams = {self.q.shard(n): ids for n in range(self.shards)}
        return self.r.xreadgroup(self.group, self.consumer, streams, count=self.count, block=block)

    def drain_pending(self):
        """Entries delivered to this consumer but not acknowledged (a crash before XACK) first."""
        while not self.stopping:
            got = self.read("0", None)
            if not any(entries for _, entries in got):
                return
            self.process(got)

    def process(self, got):
        for stream, entries in got:
            shard = int(text(stream).rsplit(":", 1)[1])
            done = []
            for entry_id, fields in entries:
                if fields:  # an empty entry is a pending one that retention trimmed away
                    for f in messages_of(fields):  # several in layout version 3, in offset order
                        handle(message(shard, entry_id, f))
                done.append(entry_id)  # acknowledged once all its messages are handled
            if done:
                self.r.xack(stream, self.group, *done)

    def run(self):
        self.resync()
        while not self.stopping:
            if time.monotonic() - self.checked > RESCAN_SECONDS:
                if self.shard_count() != self.shards:
                    self.resync()
                self.checked = time.monotonic()
            try:
                got = self.read(">", self.block_ms)
            except redis.ResponseError as e:
                # NOGROUP / UNBLOCKED: a shard stream or the group was deleted (the queue is being
                # recreated): set up again from the meta hash
                if "NOGROUP" in str(e) or "UNBLOCKED" in str(e):
                    self.resync()
                    continue
                raise
            if got:
                self.process(got)


def dead_letters(r, q):
    """Print every dead letter: the entry's fields plus group, error, attempts and failed_at. A dead
    letter holds one message, in version 1's or 2's fields (never several)."""
    for entry_id, fields in r.xrange(q.dlq, "-", "+"):
        f = {k: text(v) for k, v in messages_of(fields)[0].items()}
        print(json.dumps({
            "entry_id": text(entry_id),
            "group": f["group"],
            "error": f["error"],
            "attempts": int(f["attempts"]),
            "failed_at": int(f["failed_at"]),
            "offset": int(f["off"]),
            "id": f["id"],
            "partition": f["p"],
            "payload": f["d"],
        }), flush=True)


def main():
    ap = argparse.ArgumentParser(description="Consume a pgrelay queue with redis-py.")
    ap.add_argument("queue")
    ap.add_argument("--url", default="redis://127.0.0.1:6379")
    ap.add_argument("--prefix", default="pgrelay")
    ap.add_argument("--group", default="example")
    ap.add_argument("--consumer", default="example", help="consumer name inside the group (one process per group)")
    ap.add_argument("--start", choices=["earliest", "latest"], default="earliest", help="where a new group starts")
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--block-ms", type=int, default=1000)
    ap.add_argument("--dlq", action="store_true", help="print the dead letters and exit")
    args = ap.parse_args()

    r = redis.Redis.from_url(args.url)
    q = Queue(args.prefix, args.queue)
    if args.dlq:
        dead_letters(r, q)
        return
    c = Consumer(r, q, args.group, args.consumer, "0" if args.start == "earliest" else "$", args.count, args.block_ms)

    def stop(*_):
        c.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    c.run()


if __name__ == "__main__":
    main()
