#!/usr/bin/env node
// Consume a pgrelay queue with ioredis, following the public layout (docs/design.md section 4).
//
//   node consumer.js --url redis://127.0.0.1:6379 --group my_app orders
//   node consumer.js --url redis://127.0.0.1:6379 --dlq orders
//
// The first form reads every shard of queue `orders` through the consumer group `my_app` and prints
// each message as one JSON line, then acknowledges its stream entry (which may hold several). The
// second prints the dead letters and exits.
// See examples/README.md for what the example does and does not do.
'use strict';

const Redis = require('ioredis');

const RESCAN_MS = 5000; // how often the shard count is read again
const LAYOUT_VERSIONS = ['1', '2', '3']; // the layout versions (meta `version`) this consumer reads

function parseArgs(argv) {
  const o = { url: 'redis://127.0.0.1:6379', prefix: 'pgrelay', group: 'example', consumer: 'example',
    start: 'earliest', count: 100, blockMs: 1000, dlq: false, queue: '' };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const next = () => { if (i + 1 >= argv.length) throw new Error(`${a} needs a value`); return argv[++i]; };
    switch (a) {
      case '--url': o.url = next(); break;
      case '--prefix': o.prefix = next(); break;
      case '--group': o.group = next(); break;
      case '--consumer': o.consumer = next(); break;
      case '--start': o.start = next(); break;
      case '--count': o.count = Number(next()); break;
      case '--block-ms': o.blockMs = Number(next()); break;
      case '--dlq': o.dlq = true; break;
      default:
        if (a.startsWith('-') || o.queue) throw new Error(`unexpected argument ${a}`);
        o.queue = a;
    }
  }
  if (!o.queue) throw new Error('usage: consumer.js [--url U] [--prefix P] [--group G] [--consumer C] [--start earliest|latest] [--dlq] <queue>');
  return o;
}

// The key names of one queue (the hash tag {queue} puts them all in one cluster slot).
function keys(prefix, queue) {
  const base = `${prefix}:{${queue}}:`;
  return { meta: base + 'meta', dlq: base + 'dlq', shard: (n) => `${base}s:${n}` };
}

// messagesOf turns a stream entry's [k1, v1, k2, v2, ...], read as Buffers (xreadgroupBuffer,
// xrangeBuffer), into its messages: objects with layout version 1's fields (off, p, id, tx, ts, h,
// d) as text, and the entry's other fields (a dead letter's group, error, ...).
// An entry tells its layout by itself. Version 1: the seven fields. Version 2: `m`, a JSON object
// (off, p, id, tx, ts, and h when present), and `d`. Version 3: `m`, a JSON array of such objects
// in offset order, each with `len`, the byte length of its payload, and `d`, the payloads one
// after another: each message's payload is the next `len` bytes of d, so d is sliced as a Buffer
// (a string would be sliced by characters). m's members become the fields (h as JSON text, ""
// when absent).
function messagesOf(list) {
  const f = {};
  for (let i = 0; i + 1 < list.length; i += 2) {
    const k = list[i].toString();
    f[k] = k === 'm' || k === 'd' ? list[i + 1] : list[i + 1].toString();
  }
  const { m, d, ...rest } = f;
  if (m === undefined) return [{ ...rest, d: d.toString() }]; // version 1
  let ms = JSON.parse(m.toString());
  if (!Array.isArray(ms)) ms = [{ ...ms, len: d.length }]; // version 2: one message, all of d
  let at = 0;
  return ms.map((x) => ({ ...rest, off: String(x.off), p: x.p, id: x.id, tx: x.tx, ts: String(x.ts),
    h: x.h === undefined ? '' : JSON.stringify(x.h), d: d.subarray(at, (at += x.len)).toString() }));
}

// The application's work. Here: decode the event and print the message as a JSON line.
// JSON.parse turns numbers into doubles: a bigint above 2^53 or a long numeric loses digits. Keep
// `payload` as text (as printed here) or parse it with a big-number JSON parser when such columns
// matter. Make this idempotent by `id` or by (shard, offset): after a crash the messages read but
// not yet acknowledged are delivered again.
function handle(msg) {
  const event = JSON.parse(msg.payload);
  void [event.op, event.table, event.key]; // what an application would use
  process.stdout.write(JSON.stringify(msg) + '\n');
}

class Consumer {
  constructor(opts) {
    this.o = opts;
    this.k = keys(opts.prefix, opts.queue);
    this.cmd = new Redis(opts.url);    // HGET, XGROUP, XACK
    this.reader = new Redis(opts.url); // the blocking XREADGROUP has a connection of its own
    this.shards = 0;
    this.checked = 0;
    this.stopping = false;
  }

  // The queue's shard count (0 while it does not exist). A layout version this reader does not
  // know (no `version` is 1) would be read wrongly: it stops instead.
  async shardCount() {
    const [shards, version] = await this.cmd.hmget(this.k.meta, 'shards', 'version');
    if (version !== null && !LAYOUT_VERSIONS.includes(version)) {
      process.stderr.write(`queue ${this.k.meta}: layout version ${version}; this consumer reads versions ${LAYOUT_VERSIONS.join(', ')}: upgrade it\n`);
      process.exit(1);
    }
    return shards === null ? 0 : Number(shards);
  }

  // Create the group on every shard. A shard stream exists only once a producer wrote to it, so
  // MKSTREAM creates an empty one; BUSYGROUP means the group is there already.
  async setup(shards) {
    const start = this.o.start === 'latest' ? '$' : '0';
    for (let n = 0; n < shards; n++) {
      try {
        await this.cmd.xgroup('CREATE', this.k.shard(n), this.o.group, start, 'MKSTREAM');
      } catch (e) {
        if (!String(e.message).startsWith('BUSYGROUP')) throw e;
      }
    }
    this.shards = shards;
    this.checked = Date.now();
    await this.drainPending();
  }

  // Read `shards` again (a queue deleted and created again may have another count) and set the
  // group up on every shard; wait while the queue does not exist.
  async resync() {
    while (!this.stopping) {
      const shards = await this.shardCount();
      if (shards > 0) {
        if (shards !== this.shards) process.stderr.write(`queue ${this.k.meta}: ${shards} shards\n`);
        await this.setup(shards);
        return;
      }
      await new Promise((r) => setTimeout(r, 500));
    }
  }

  read(id, blockMs) {
    const streams = [];
    for (let n = 0; n < this.shards; n++) streams.push(this.k.shard(n));
    const args = ['GROUP', this.o.group, this.o.consumer, 'COUNT', this.o.count];
    if (blockMs !== undefined) args.push('BLOCK', blockMs);
    args.push('STREAMS', ...streams, ...streams.map(() => id));
    return this.reader.xreadgroupBuffer(...args); // Buffers: a version-3 entry's d is split by bytes
  }

  // Entries delivered to this consumer but not acknowledged (a crash before XACK) first.
  async drainPending() {
    while (!this.stopping) {
      const got = await this.read('0');
      if (!got || got.every(([, entries]) => entries.length === 0)) return;
      await this.process(got);
    }
  }

  async process(got) {
    for (const [streamBuf, entries] of got) {
      const stream = streamBuf.toString();
      const shard = Number(stream.slice(stream.lastIndexOf(':') + 1));
      const done = [];
      for (const [idBuf, list] of entries) {
        const entryId = idBuf.toString();
        // a null entry is a pending one that retention trimmed away; version 3: several messages
        for (const f of list ? messagesOf(list) : []) {
          handle({ shard, offset: Number(f.off), entry_id: entryId, id: f.id, partition: f.p, tx: f.tx,
            created_at: Number(f.ts), header: f.h, payload: f.d });
        }
        done.push(entryId); // acknowledged once all its messages are handled
      }
      if (done.length) await this.cmd.xack(stream, this.o.group, ...done);
    }
  }

  async run() {
    await this.resync();
    while (!this.stopping) {
      if (Date.now() - this.checked > RESCAN_MS) {
        if ((await this.shardCount()) !== this.shards) await this.resync();
        this.checked = Date.now();
      }
      let got;
      try {
        got = await this.read('>', this.o.blockMs);
      } catch (e) {
        // NOGROUP / UNBLOCKED: a shard stream or the group was deleted (the queue is being
        // recreated): set up again from the meta hash
        if (/NOGROUP|UNBLOCKED/.test(e.message)) { await this.resync(); continue; }
        throw e;
      }
      if (got) await this.process(got);
    }
  }

  async close() {
    await Promise.all([this.cmd.quit(), this.reader.quit()]);
  }
}

// Print every dead letter: the entry's fields plus group, error, attempts and failed_at. A dead
// letter holds one message, in version 1's or 2's fields (never several).
async function deadLetters(opts) {
  const r = new Redis(opts.url);
  try {
    for (const [entryId, list] of await r.xrangeBuffer(keys(opts.prefix, opts.queue).dlq, '-', '+')) {
      const [f] = messagesOf(list);
      process.stdout.write(JSON.stringify({ entry_id: entryId.toString(), group: f.group, error: f.error,
        attempts: Number(f.attempts), failed_at: Number(f.failed_at), offset: Number(f.off), id: f.id,
        partition: f.p, payload: f.d }) + '\n');
    }
  } finally {
    await r.quit();
  }
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  if (opts.dlq) return deadLetters(opts);
  const c = new Consumer(opts);
  const stop = () => { c.stopping = true; };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
  try {
    await c.run();
  } finally {
    await c.close();
  }
}

main().catch((e) => { process.stderr.write(`${e.stack || e}\n`); process.exit(1); });
