"use strict";
// The like counter's behaviour as plain functions, free of the CloudState SDK (see src/index.js).
// Runs on the image's Node 12: no syntax newer than ES2019.
//
// The state is a PNCounter CRDT, kept by the SDK and replicated by the CloudState proxies. Each
// replica decides on its own copy: decide(likes, command) -> { delta } | { error }.

/** The change a command makes to the counter whose current value is `likes`, or why not. */
function decide(likes, command) {
  switch (command.type) {
    case "Like":
      return { delta: 1 };
    case "Unlike":
      if (likes <= 0) return { error: "item " + JSON.stringify(command.itemId) + " has no likes to take back" };
      return { delta: -1 };
    case "GetLikes":
      return { delta: 0 };
    default:
      return { error: "unknown command " + JSON.stringify(command.type) };
  }
}

/** The count clients see. Two replicas may each accept an Unlike of the last like before they
 * merge, so the merged counter can drop below zero; it is shown as zero. */
function shown(value) {
  return Math.max(0, value);
}

// A reference model of the PNCounter the SDK and proxy replicate: per replica, a grow-only count
// of increments (p) and of decrements (n); merging takes the larger count of each replica. The
// tests use it to show why shown() clamps.
const pnCounter = {
  empty: function () {
    return { p: {}, n: {} };
  },
  add: function (counter, replica, delta) {
    const side = delta >= 0 ? "p" : "n";
    const next = { p: Object.assign({}, counter.p), n: Object.assign({}, counter.n) };
    next[side][replica] = (next[side][replica] || 0) + Math.abs(delta);
    return next;
  },
  merge: function (a, b) {
    function maxOf(x, y) {
      const out = Object.assign({}, x);
      Object.keys(y).forEach(function (key) {
        out[key] = Math.max(out[key] || 0, y[key]);
      });
      return out;
    }
    return { p: maxOf(a.p, b.p), n: maxOf(a.n, b.n) };
  },
  value: function (counter) {
    function sum(side) {
      return Object.keys(side).reduce(function (total, key) {
        return total + side[key];
      }, 0);
    }
    return sum(counter.p) - sum(counter.n);
  },
};

module.exports = { decide: decide, shown: shown, pnCounter: pnCounter };
