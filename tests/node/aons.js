#!/usr/bin/env node
'use strict';

// The Node.js RocketMQ remoting client ali-ons (tests/node/package.json pins it) driven against a rocket server, as
// an application on an open-source cluster uses it: `nameSrv` is rocket's TCP address. With AONS_ACCESS_KEY and
// AONS_SECRET_KEY in the environment it signs every request with them (accessKey and secretKey), for a rocket that
// runs with auth on. For tests/integration/test_remoting_aons.py.
//
// Output: JSON lines on stdout, one object each, and nothing else there; ali-ons' own logs go to stderr (warnings and
// errors; everything with --verbose or AONS_VERBOSE=1).
//
//   node aons.js produce --namesrv H:P --topic T --count N [--tags a,b,c] [--key-prefix K] [--prop k=v ...]
//                        [--senders N]  (N sends outstanding at once; one by default, in order)
//                        [--body-prefix P] [--delay-level L] [--group PG] [--timeout-s S]
//     message i has body P+i (P: msg-), tag tags[i % len] (none without --tags), key K+i, the --prop properties
//     ({i} in a value stands for i) and the delay level L. One line per acknowledged send
//     {"body","msgId","queueId","queueOffset","tag","keys","status"}, then {"done":N}. Exit 1 when a send fails
//     or is not SEND_OK, 3 on --timeout-s (default 60), 4 when only the producer's close failed; the error is on
//     stderr.
//
//   node aons.js consume --namesrv H:P --topic T --group G [--expression 'a||b' | --sql 'a > 1']
//                        [--fail-until-attempt N] [--fail-body-regex R] [--max-reconsume N] [--from first|last]
//                        [--count N] [--timeout-s S] [--rebalance-ms MS] [--persist-ms MS] [--trace-pulled]
//     {"ready":true,"clientId"} once started; one line per message handed to the handler
//     {"body","msgId","tags","keys","props","reconsumeTimes","queueId","queueOffset","topic","localRetry","ok"}
//     (localRetry: ali-ons tries the same message again itself, its send back having failed); the handler
//     throws (ok false) for a message whose reconsumeTimes < --fail-until-attempt, or whose body matches
//     --fail-body-regex. {"rebalance":[queue ids]} whenever the set of the topic's queues this consumer holds
//     changes. With --trace-pulled, {"pulled":{...}} for every message the server returned, before ali-ons' own
//     tag filter (to tell server-side filtering from the client's). Stops after --count successes, --timeout-s
//     (default 60), SIGTERM/SIGINT, or the end of stdin when stdin is a pipe; then closes the consumer (its offsets
//     persisted, the client unregistered) and prints {"closed":true,"reason","ok","failed"}. Exit 0 when closed
//     cleanly, 1 when it could not start or close.

const fs = require('fs');
const util = require('util');

// Whatever a dependency prints with console.log must not land among the JSON lines.
console.log = console.info = console.debug = function() {
  process.stderr.write(util.format.apply(util, arguments) + '\n');
};

const ons = require('ali-ons');

const Consumer = ons.Consumer;
const Producer = ons.Producer;
const Message = ons.Message;

function out(value) {
  process.stdout.write(JSON.stringify(value) + '\n');
}

function log() {
  process.stderr.write('aons: ' + util.format.apply(util, arguments) + '\n');
}

const CREDENTIALS = process.env.AONS_ACCESS_KEY
  ? { accessKey: process.env.AONS_ACCESS_KEY, secretKey: process.env.AONS_SECRET_KEY } : {};
const VERBOSE = process.argv.indexOf('--verbose') >= 0 || !!process.env.AONS_VERBOSE;

// ali-ons' logger interface (info, warn, error, debug); the default one is console, this one is stderr.
const logger = {
  info: VERBOSE ? function() { log('info', util.format.apply(util, arguments)); } : function() {},
  debug: VERBOSE ? function() { log('debug', util.format.apply(util, arguments)); } : function() {},
  warn() { log('warn', util.format.apply(util, arguments)); },
  error() { log('error', util.format.apply(util, arguments)); },
};

// ali-ons asserts an `httpclient` (urllib in its README) but calls it only to fetch the name server list from
// onsAddr, Aliyun's address server; with `nameSrv` set it is never called. A stub keeps urllib out of the deps.
const NO_HTTP_CLIENT = {
  request() {
    return Promise.reject(new Error('aons driver: no HTTP client (nameSrv is given, onsAddr is not used)'));
  },
};

function finish(code) {
  // stdout to a pipe is synchronous on Linux; the callback covers the other cases.
  process.stdout.write('', () => process.exit(code));
}

function fail(code, message) {
  log(message);
  finish(code);
}

class UsageError extends Error {}

function parseArgs(argv, spec) {
  // spec: name -> 'string' | 'int' | 'list' (repeatable) | 'bool'
  const opts = {};
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (!arg.startsWith('--')) {
      throw new UsageError(`unexpected argument ${JSON.stringify(arg)}`);
    }
    const name = arg.slice(2);
    const kind = spec[name];
    if (!kind) {
      throw new UsageError(`unknown option ${arg}`);
    }
    if (kind === 'bool') {
      opts[name] = true;
      continue;
    }
    if (i + 1 >= argv.length) {
      throw new UsageError(`${arg} needs a value`);
    }
    const value = argv[++i];
    if (kind === 'int') {
      if (!/^-?\d+$/.test(value)) {
        throw new UsageError(`${arg} ${JSON.stringify(value)}: expected an integer`);
      }
      opts[name] = parseInt(value, 10);
    } else if (kind === 'list') {
      (opts[name] = opts[name] || []).push(value);
    } else {
      opts[name] = value;
    }
  }
  return opts;
}

function required(opts, names) {
  for (const name of names) {
    if (opts[name] === undefined) {
      throw new UsageError(`--${name} is required`);
    }
  }
}

function withTimeout(promise, ms, what) {
  let timer;
  const timeout = new Promise((resolve, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no answer in ${ms} ms`)), ms);
  });
  return Promise.race([ promise, timeout ]).then(value => {
    clearTimeout(timer);
    return value;
  }, err => {
    clearTimeout(timer);
    throw err;
  });
}

function describe(err) {
  if (!err) {
    return String(err);
  }
  const code = err.code !== undefined ? ` (code ${err.code})` : '';
  return `${err.name || 'Error'}${code}: ${err.message}\n${err.stack || ''}`;
}

// ali-ons' inner producer (Producer.defaultProducer, group CLIENT_INNER_PRODUCER) is made by every producer and
// consumer and never closed by them; its scheduled tasks would keep the process alive.
async function closeInnerProducer() {
  if (Producer.defaultProducer) {
    try {
      await withTimeout(Producer.defaultProducer.close(), 5000, 'closing the inner producer');
    } catch (err) {
      log('closing the inner producer failed:', describe(err));
    }
  }
}

async function produce(argv) {
  const opts = parseArgs(argv, {
    namesrv: 'string', topic: 'string', count: 'int', tags: 'string', 'key-prefix': 'string', prop: 'list',
    'body-prefix': 'string', 'delay-level': 'int', group: 'string', 'timeout-s': 'int', verbose: 'bool',
    senders: 'int',
  });
  required(opts, [ 'namesrv', 'topic', 'count' ]);
  const tags = opts.tags ? opts.tags.split(',').map(tag => tag.trim()).filter(Boolean) : [];
  const props = {};
  for (const item of opts.prop || []) {
    const at = item.indexOf('=');
    if (at <= 0) {
      throw new UsageError(`--prop ${JSON.stringify(item)}: expected NAME=VALUE`);
    }
    props[item.slice(0, at)] = item.slice(at + 1);
  }
  // In a --prop value, {i} stands for the message's index (0, 1, ...): --prop n={i}.
  const bodyPrefix = opts['body-prefix'] !== undefined ? opts['body-prefix'] : 'msg-';
  const timeoutS = opts['timeout-s'] !== undefined ? opts['timeout-s'] : 60;
  setTimeout(() => fail(3, `produce: not done in ${timeoutS} s`), timeoutS * 1000).unref();

  const producer = new Producer({
    ...CREDENTIALS,
    nameSrv: opts.namesrv,
    httpclient: NO_HTTP_CLIENT,
    producerGroup: opts.group || 'aons-producer',
    logger,
  });
  producer.on('error', err => log('producer error:', describe(err)));
  try {
    await producer.ready();
  } catch (err) {
    return fail(1, 'produce: the producer did not start: ' + describe(err));
  }

  // --senders N: N sends outstanding at once (benchmarks/rocketmq_client.py); by default one, in order.
  let next = 0;
  let failed = null;
  const sendAll = async () => {
    while (next < opts.count && failed === null) {
      const code = await sendOne(next++);
      if (code !== null) {
        failed = code;
      }
    }
  };
  await Promise.all(Array.from({ length: Math.max(1, opts.senders || 1) }, sendAll));
  if (failed !== null) {
    return failed;
  }
  out({ done: opts.count });

  async function sendOne(i) {
    const body = bodyPrefix + i;
    const tag = tags.length ? tags[i % tags.length] : null;
    const msg = new Message(opts.topic, tag, body);
    if (!tag) {
      // Message's constructor stores a missing tag as TAGS=null, which goes on the wire as the tag "null".
      delete msg.properties.TAGS;
    }
    if (opts['key-prefix'] !== undefined) {
      msg.keys = [ opts['key-prefix'] + i ];
    }
    for (const name of Object.keys(props)) {
      msg.properties[name] = props[name].split('{i}').join(String(i));
    }
    if (opts['delay-level'] !== undefined) {
      msg.delayTimeLevel = opts['delay-level'];
    }
    let result;
    try {
      result = await producer.send(msg);
    } catch (err) {
      return fail(1, `produce: send of ${JSON.stringify(body)} failed: ${describe(err)}`);
    }
    const line = {
      body,
      msgId: result.msgId,
      queueId: Number(result.messageQueue.queueId),
      queueOffset: result.queueOffset,
      tag,
      keys: msg.keys || null,
      status: result.sendStatus,
    };
    out(line);
    if (result.sendStatus !== 'SEND_OK') {
      return fail(1, `produce: send of ${JSON.stringify(body)} answered ${result.sendStatus}`);
    }
    return null;
  }

  let code = 0;
  try {
    await withTimeout(producer.close(), 10000, 'closing the producer');
  } catch (err) {
    log('produce: closing the producer failed:', describe(err));
    code = 4;
  }
  await closeInnerProducer();
  finish(code);
}

async function consume(argv) {
  const opts = parseArgs(argv, {
    namesrv: 'string', topic: 'string', group: 'string', expression: 'string', sql: 'string',
    'fail-until-attempt': 'int', 'fail-body-regex': 'string', 'max-reconsume': 'int', from: 'string',
    count: 'int', 'timeout-s': 'int', 'rebalance-ms': 'int', 'persist-ms': 'int', 'trace-pulled': 'bool',
    broadcast: 'bool', verbose: 'bool',
  });
  required(opts, [ 'namesrv', 'topic', 'group' ]);
  if (opts.expression !== undefined && opts.sql !== undefined) {
    throw new UsageError('give --expression or --sql, not both');
  }
  const from = opts.from || 'last';
  if (from !== 'first' && from !== 'last') {
    throw new UsageError(`--from ${JSON.stringify(from)}: expected first or last`);
  }
  const topic = opts.topic;
  const failUntil = opts['fail-until-attempt'] || 0;
  const failRegex = opts['fail-body-regex'] !== undefined ? new RegExp(opts['fail-body-regex']) : null;
  const timeoutS = opts['timeout-s'] !== undefined ? opts['timeout-s'] : 60;

  if (opts['trace-pulled']) {
    // Every message a pull returned goes through ProcessQueue#putMessage, before ali-ons filters on tags itself.
    const ProcessQueue = require('ali-ons/lib/process_queue');
    const putMessage = ProcessQueue.prototype.putMessage;
    ProcessQueue.prototype.putMessage = function(msgs) {
      for (const msg of msgs) {
        out({ pulled: {
          body: msg.body ? msg.body.toString() : '', tags: msg.tags, topic: msg.topic,
          queueId: msg.queueId, queueOffset: msg.queueOffset, reconsumeTimes: msg.reconsumeTimes,
        } });
      }
      return putMessage.call(this, msgs);
    };
  }

  const options = {
    ...CREDENTIALS,
    nameSrv: opts.namesrv,
    httpclient: NO_HTTP_CLIENT,
    consumerGroup: opts.group,
    consumeFromWhere: from === 'first' ? 'CONSUME_FROM_FIRST_OFFSET' : 'CONSUME_FROM_LAST_OFFSET',
    logger,
  };
  if (opts['max-reconsume'] !== undefined) {
    options.maxReconsumeTimes = opts['max-reconsume'];
  }
  if (opts['rebalance-ms'] !== undefined) {
    options.rebalanceInterval = opts['rebalance-ms']; // ali-ons rebalances on this timer only (default 10 s)
  }
  if (opts['persist-ms'] !== undefined) {
    options.persistConsumerOffsetInterval = opts['persist-ms'];
  }
  if (opts.broadcast) {
    options.isBroadcast = true; // every member consumes every queue; offsets stay in the client (ali-ons' memory)
  }
  const consumer = new Consumer(options);
  consumer.on('error', err => {
    if (!/aons driver: failing/.test(err && err.message)) {
      log('consumer error:', describe(err));
    }
  });

  let stopping = false;
  let holding = false; // --count reached: later messages are held, not handled, until the close
  let succeeded = 0;
  let failed = 0;
  let lastQueues = '[]';
  const holdForever = new Promise(() => {});
  // ali-ons retries a message locally (the same object, reconsumeTimes + 1, after 5 s) when its send back to the
  // broker (CONSUMER_SEND_MSG_BACK, then a send to %RETRY%group) failed: such tries are marked localRetry.
  const handed = new WeakSet();

  function heldQueues() {
    const ids = [];
    for (const item of consumer.processQueueTable.values()) {
      if (item && item.messageQueue.topic === topic) {
        ids.push(Number(item.messageQueue.queueId));
      }
    }
    return ids.sort((a, b) => a - b);
  }

  function checkQueues() {
    if (stopping) {
      return;
    }
    const ids = heldQueues();
    const key = JSON.stringify(ids);
    if (key !== lastQueues) {
      lastQueues = key;
      out({ rebalance: ids });
    }
  }

  async function handle(msg) {
    if (stopping || holding) {
      // Not acknowledged: its queue's offset stays before it, so the next holder of the queue gets it.
      return holdForever;
    }
    const localRetry = handed.has(msg);
    handed.add(msg);
    const body = msg.body ? msg.body.toString() : '';
    const ok = !(msg.reconsumeTimes < failUntil) && !(failRegex && failRegex.test(body));
    out({
      body,
      msgId: msg.msgId,
      tags: msg.tags,
      keys: msg.keys || null,
      props: msg.properties,
      reconsumeTimes: msg.reconsumeTimes,
      queueId: msg.queueId,
      queueOffset: msg.queueOffset,
      topic: msg.topic,
      localRetry,
      ok,
    });
    if (!ok) {
      failed++;
      throw new Error(`aons driver: failing ${JSON.stringify(body)} on purpose (reconsumeTimes ${msg.reconsumeTimes})`);
    }
    succeeded++;
    if (opts.count !== undefined && succeeded >= opts.count) {
      // ali-ons hands over the next message of a pulled batch in the same turn of the event loop: hold it now.
      // Close in a later turn, once ali-ons updated this message's offset (it does so when the handler resolves).
      holding = true;
      setImmediate(() => stop('count'));
    }
  }

  const subscription = opts.sql !== undefined ? { expressionType: 'SQL92', subString: opts.sql } :
    (opts.expression !== undefined ? opts.expression : '*');
  consumer.subscribe(topic, subscription, handle);
  consumer.on(`topic_${topic}_queue_changed`, checkQueues);
  const poll = setInterval(checkQueues, 200);
  const deadline = setTimeout(() => stop('timeout'), timeoutS * 1000);

  async function stop(reason) {
    if (stopping) {
      return;
    }
    stopping = true;
    clearInterval(poll);
    clearTimeout(deadline);
    setTimeout(() => fail(1, 'consume: closing took over 20 s'), 20000).unref();
    let closed = true;
    try {
      await withTimeout(consumer.close(), 15000, 'closing the consumer');
    } catch (err) {
      closed = false;
      log('consume: closing the consumer failed:', describe(err));
    }
    await closeInnerProducer();
    out({ closed, reason, ok: succeeded, failed });
    finish(closed ? 0 : 1);
  }

  process.on('SIGTERM', () => stop('signal'));
  process.on('SIGINT', () => stop('signal'));
  let stdinIsPipe = false;
  try {
    stdinIsPipe = fs.fstatSync(0).isFIFO();
  } catch (err) {
    stdinIsPipe = false;
  }
  if (stdinIsPipe) {
    process.stdin.on('end', () => stop('stdin'));
    process.stdin.on('error', () => stop('stdin'));
    process.stdin.resume();
  }

  try {
    await withTimeout(consumer.ready(), timeoutS * 1000, 'starting the consumer');
  } catch (err) {
    return fail(1, 'consume: the consumer did not start: ' + describe(err));
  }
  if (!stopping) {
    out({ ready: true, clientId: consumer._mqClient.clientId });
  }
}

async function main() {
  process.on('unhandledRejection', err => log('unhandled rejection:', describe(err)));
  const command = process.argv[2];
  const argv = process.argv.slice(3);
  try {
    if (command === 'produce') {
      await produce(argv);
    } else if (command === 'consume') {
      await consume(argv);
    } else {
      fail(2, 'usage: aons.js produce|consume --namesrv HOST:PORT --topic TOPIC ... (see the comment at the top)');
    }
  } catch (err) {
    if (err instanceof UsageError) {
      fail(2, `${command}: ${err.message}`);
    } else {
      fail(1, `${command}: ${describe(err)}`);
    }
  }
}

main();
