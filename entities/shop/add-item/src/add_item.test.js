"use strict";
// node --test: the add-item action's validation, and its copy of the cart's API.
const test = require("node:test");
const assert = require("node:assert/strict");
const fs = require("node:fs");
const path = require("node:path");
const { validate, cartAddress, MAX_QUANTITY, DEFAULT_CART_ADDRESS } = require("./add_item");

const VALID = { userId: "ada@example", productId: "green-tea", name: " Green tea ", quantity: 3 };

test("a valid request becomes the cart's AddItem command", () => {
  assert.deepEqual(validate(VALID), {
    command: { userId: "ada@example", productId: "green-tea", name: "Green tea", quantity: 3 },
  });
  assert.equal(validate({ ...VALID, name: "" }).command.name, "green-tea");
  assert.equal(validate({ ...VALID, quantity: MAX_QUANTITY }).command.quantity, MAX_QUANTITY);
});

test("invalid requests are rejected with every reason", () => {
  const cases = [
    [{ quantity: 0 }, /quantity 0 must be a whole number from 1 to 99/],
    [{ quantity: -1 }, /quantity -1/],
    [{ quantity: MAX_QUANTITY + 1 }, /quantity 100 must be a whole number from 1 to 99/],
    [{ quantity: 2.5 }, /quantity 2.5/],
    [{ quantity: "3" }, /quantity "3"/],
    [{ productId: "" }, /productId "" must be 1-64 letters, digits, '_' or '-'/],
    [{ productId: "tea cup" }, /productId "tea cup"/],
    [{ productId: "x".repeat(65) }, /productId "x{65}"/],
    [{ userId: "" }, /userId "" must be 1-128/],
    [{ userId: undefined }, /userId null/],
    [{ name: "n".repeat(201) }, /name must be at most 200 characters/],
  ];
  for (const [change, expected] of cases) {
    const result = validate({ ...VALID, ...change });
    assert.equal(result.command, undefined, JSON.stringify(change));
    assert.match(result.error, /^invalid add-item request: /);
    assert.match(result.error, expected);
  }
  const all = validate({}).error;
  for (const field of ["userId", "productId", "quantity"]) assert.match(all, new RegExp(field));
});

test("the cart address comes from CART_ADDRESS and must be host:port", () => {
  assert.equal(cartAddress({}), DEFAULT_CART_ADDRESS);
  assert.equal(cartAddress({ CART_ADDRESS: "shop-cart.shop-test.svc:80" }), "shop-cart.shop-test.svc:80");
  assert.throws(() => cartAddress({ CART_ADDRESS: "http://shop-cart" }), /CART_ADDRESS "http:\/\/shop-cart" must be host:port/);
});

// Field lines of each message of a .proto text: name -> ["type name = number", ...].
function messages(text) {
  const found = {};
  for (const [, name, body] of text.matchAll(/^message (\w+) \{([^}]*)\}/gm)) {
    found[name] = [...body.matchAll(/^\s*((?:repeated )?[\w.]+ \w+ = \d+)/gm)].map((m) => m[1]);
  }
  return found;
}

// The cart's .proto lives beside this entity in the repository, not in this entity's build context:
// the image build's test stage (the Dockerfile) has only add-item's files, so it skips this check,
// which the repository's test run (scripts/test.sh) makes.
const CART_PROTO = path.join(__dirname, "..", "..", "cart", "cart.proto");

test("cart_client.proto matches the cart's own API", { skip: !fs.existsSync(CART_PROTO) && "cart.proto is outside this build context" }, () => {
  const read = (...parts) => fs.readFileSync(path.join(__dirname, "..", ...parts), "utf8");
  const client = read("cart_client.proto");
  const cart = read("..", "cart", "cart.proto");
  for (const text of [client, cart]) assert.match(text, /^package shop\.cart;/m);
  assert.match(cart, /rpc AddItem\(AddLineItem\) returns \(google\.protobuf\.Empty\);/);
  assert.match(client, /rpc AddItem\(AddLineItem\) returns \(google\.protobuf\.Empty\);/);
  const ours = messages(client);
  const theirs = messages(cart);
  assert.deepEqual(Object.keys(ours), ["AddLineItem"]);
  assert.deepEqual(ours.AddLineItem, theirs.AddLineItem);
  // The command validate() builds has exactly the message's fields.
  const fields = ours.AddLineItem.map((line) => line.split(" ")[1].replace(/_(\w)/g, (_, c) => c.toUpperCase()));
  assert.deepEqual(Object.keys(validate(VALID).command).sort(), fields.sort());
});
