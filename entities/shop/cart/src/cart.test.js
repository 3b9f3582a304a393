"use strict";
// node --test: the cart's rules, without the SDK, a proxy or a network.
const test = require("node:test");
const assert = require("node:assert/strict");
const fs = require("node:fs");
const path = require("node:path");
const { decide, evolve, replay, initialState, EVENT_TYPES, MAX_LINE_QUANTITY } = require("./cart");

function run(commands) {
  let cart = initialState();
  const events = [];
  for (const command of commands) {
    const result = decide(cart, command);
    assert.equal(result.error, undefined, `${command.type} rejected: ${result.error}`);
    result.events.forEach((event) => {
      cart = evolve(cart, event);
      events.push(event);
    });
  }
  return { cart, events };
}

test("adding and removing items emits ItemAdded/ItemRemoved and replay rebuilds the cart", () => {
  const { cart, events } = run([
    { type: "AddItem", productId: "tea", name: "Green tea", quantity: 2 },
    { type: "AddItem", productId: "cup", name: "Cup", quantity: 1 },
    { type: "AddItem", productId: "tea", name: "", quantity: 3 },
    { type: "RemoveItem", productId: "cup" },
    { type: "GetCart" },
  ]);
  assert.deepEqual(events.map((e) => e.type), ["ItemAdded", "ItemAdded", "ItemAdded", "ItemRemoved"]);
  // Quantities of one product add up; an empty name keeps the line's name.
  assert.deepEqual(cart, { items: [{ productId: "tea", name: "Green tea", quantity: 5 }] });
  assert.deepEqual(replay(events), cart);
});

test("a product without a name is listed under its id", () => {
  assert.deepEqual(run([{ type: "AddItem", productId: "tea", quantity: 1 }]).cart.items[0].name, "tea");
});

test("invalid commands are rejected with the reason", () => {
  const { cart } = run([{ type: "AddItem", productId: "tea", name: "Tea", quantity: MAX_LINE_QUANTITY - 1 }]);
  const cases = [
    [{ type: "AddItem", productId: "", quantity: 1 }, /productId is required/],
    [{ type: "AddItem", productId: "tea", quantity: 0 }, /quantity 0 of "tea" must be a whole number of at least 1/],
    [{ type: "AddItem", productId: "tea", quantity: -2 }, /quantity -2/],
    [{ type: "AddItem", productId: "tea", quantity: 1.5 }, /quantity 1.5/],
    [{ type: "AddItem", productId: "tea", quantity: 2 }, /the cart would hold 1001 of "tea"; at most 1000 allowed/],
    [{ type: "RemoveItem", productId: "cup" }, /product "cup" is not in the cart/],
    [{ type: "Checkout" }, /unknown command "Checkout"/],
  ];
  for (const [command, expected] of cases) {
    const result = decide(cart, command);
    assert.equal(result.events, undefined, JSON.stringify(command));
    assert.match(result.error, expected);
  }
  assert.deepEqual(decide(cart, { type: "AddItem", productId: "tea", quantity: 1 }).events.length, 1);
});

test("evolve handles every event type and refuses others", () => {
  let cart = evolve(initialState(), { type: "ItemAdded", item: { productId: "a", name: "A", quantity: 1 } });
  cart = evolve(cart, { type: "ItemRemoved", productId: "a" });
  assert.deepEqual(cart, initialState());
  assert.deepEqual(EVENT_TYPES, ["ItemAdded", "ItemRemoved"]);
  assert.throws(() => evolve(cart, { type: "CartExploded" }), /unknown event type "CartExploded"/);
});

test("cart.proto declares the commands and events the logic knows", () => {
  const proto = fs.readFileSync(path.join(__dirname, "..", "cart.proto"), "utf8");
  const rpcs = [...proto.matchAll(/^\s*rpc (\w+)\(/gm)].map((m) => m[1]);
  assert.deepEqual(rpcs, ["AddItem", "RemoveItem", "GetCart"]);
  for (const rpc of rpcs) assert.doesNotMatch(decide(initialState(), { type: rpc }).error || "", /unknown command/);
  for (const event of EVENT_TYPES) assert.match(proto, new RegExp(`^message ${event} \\{`, "m"));
});
