"use strict";
// node --test: the like counter's rules and the PNCounter's merge semantics, without the SDK.
const test = require("node:test");
const assert = require("node:assert/strict");
const fs = require("node:fs");
const path = require("node:path");
const { decide, shown, pnCounter } = require("./likes");

test("likes go up and down, never below zero on one replica", () => {
  assert.deepEqual(decide(0, { type: "Like", itemId: "tea" }), { delta: 1 });
  assert.deepEqual(decide(2, { type: "Unlike", itemId: "tea" }), { delta: -1 });
  assert.deepEqual(decide(0, { type: "Unlike", itemId: "tea" }), { error: 'item "tea" has no likes to take back' });
  assert.deepEqual(decide(-1, { type: "Unlike", itemId: "tea" }).error, 'item "tea" has no likes to take back');
  assert.deepEqual(decide(5, { type: "GetLikes", itemId: "tea" }), { delta: 0 });
  assert.match(decide(0, { type: "Dislike" }).error, /unknown command "Dislike"/);
});

test("PNCounter merge is commutative, associative and idempotent", () => {
  const a = pnCounter.add(pnCounter.add(pnCounter.empty(), "a", 1), "a", 1);
  const b = pnCounter.add(pnCounter.add(pnCounter.empty(), "b", 1), "b", -1);
  const c = pnCounter.add(pnCounter.empty(), "c", 3);
  const { merge, value } = pnCounter;
  assert.deepEqual(merge(a, b), merge(b, a));
  assert.deepEqual(merge(merge(a, b), c), merge(a, merge(b, c)));
  assert.deepEqual(merge(a, a), a);
  assert.equal(value(merge(merge(a, b), c)), 5);
});

test("concurrent likes on two replicas all count once merged", () => {
  let one = pnCounter.empty();
  let two = pnCounter.empty();
  one = pnCounter.add(one, "one", decide(pnCounter.value(one), { type: "Like" }).delta);
  two = pnCounter.add(two, "two", decide(pnCounter.value(two), { type: "Like" }).delta);
  // Delivering the same state twice changes nothing.
  const merged = pnCounter.merge(pnCounter.merge(one, two), two);
  assert.equal(pnCounter.value(merged), 2);
});

test("concurrent unlikes of the last like can overshoot; clients see zero", () => {
  const start = pnCounter.add(pnCounter.empty(), "one", 1);
  let one = start;
  let two = start;
  one = pnCounter.add(one, "one", decide(pnCounter.value(one), { type: "Unlike" }).delta);
  two = pnCounter.add(two, "two", decide(pnCounter.value(two), { type: "Unlike" }).delta);
  const merged = pnCounter.merge(one, two);
  assert.equal(pnCounter.value(merged), -1);
  assert.equal(shown(pnCounter.value(merged)), 0);
  assert.equal(shown(3), 3);
});

test("likes.proto declares the commands decide() knows", () => {
  const proto = fs.readFileSync(path.join(__dirname, "..", "likes.proto"), "utf8");
  const rpcs = [...proto.matchAll(/^\s*rpc (\w+)\(/gm)].map((m) => m[1]);
  assert.deepEqual(rpcs, ["Like", "Unlike", "GetLikes"]);
  for (const rpc of rpcs) assert.equal(decide(1, { type: rpc }).error, undefined, rpc);
});
