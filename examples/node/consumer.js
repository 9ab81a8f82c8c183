#!/usr/bin/env node
// Consume a pgrelay queue with ioredis, following the public layout (docs/design.md section 4).
//
//   node consumer.js --url redis://127.0.0.1:6379 --group my_app orders
//   node consumer.js --url redis://127.0.0.1:6379 --dlq orders
//
// The first form reads every shard of queue `orders` through the consumer group `my_app` and prints
// each message as one JSON line, then acknowledges it. The second prints the dead letters and exits.
// See examples/README.md for what the example does and does not do.
'use strict';

const Redis = require('ioredis');

const RESCAN_MS = 5000; // how often the shard count is read again
const LAYOUT_VERSIONS = ['1', '2']; // the layout versions (meta `version`) this consumer reads

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

// fieldsOf turns a stream entry's [k1, v1, k2, v2, ...] into an object with the fields of layout
// version 1 (off, p, id, tx, ts, h, d). A queue of layout version 2 (the meta hash's `version`)
// has two fields, `m` (a JSON object: off, p, id, tx, ts, and h when present) and `d`: m's members
// become the fields (h as JSON text, "" when absent). Both are read, so a consumer follows either.
function fieldsOf(list) {
  const f = {};
  for (let i = 0; i + 1 < list.length; i += 2) f[list[i]] = list[i + 1];
  if (f.m !== undefined) {
    const m = JSON.parse(f.m);
    Object.assign(f, { off: String(m.off), p: m.p, id: m.id, tx: m.tx, ts: String(m.ts),
      h: m.h === undefined ? '' : JSON.stringify(m.h) });
    delete f.m;
  }
  return f;
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
    return this.reader.xreadgroup(...args);
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
    for (const [stream, entries] of got) {
      const shard = Number(stream.slice(stream.lastIndexOf(':') + 1));
      const done = [];
      for (const [entryId, list] of entries) {
        if (list) { // a null entry is a pending one that retention trimmed away
          const f = fieldsOf(list);
          handle({ shard, offset: Number(f.off), entry_id: entryId, id: f.id, partition: f.p, tx: f.tx,
            created_at: Number(f.ts), header: f.h, payload: f.d });
        }
        done.push(entryId);
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

// Print every dead letter: the entry's fields plus group, error, attempts and failed_at.
async function deadLetters(opts) {
  const r = new Redis(opts.url);
  try {
    for (const [entryId, list] of await r.xrange(keys(opts.prefix, opts.queue).dlq, '-', '+')) {
      const f = fieldsOf(list);
      process.stdout.write(JSON.stringify({ entry_id: entryId, group: f.group, error: f.error,
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
