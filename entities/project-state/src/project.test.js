"use strict";
// node --test: the Project entity's rules, without the SDK, a proxy or a network.
const test = require("node:test");
const assert = require("node:assert/strict");
const fs = require("node:fs");
const path = require("node:path");
const { decide, evolve, replay, initialState, EVENT_TYPES, LANGUAGES } = require("./project");

const PROTO = fs.readFileSync(path.join(__dirname, "..", "project.proto"), "utf8");
const DIGEST = "sha256:" + "ab".repeat(32);
const CART_IMAGE = "localhost:5000/shop/cart:0a1b2c3d@" + DIGEST;

// Applies commands one by one, failing the test on a rejection; returns the state and all events.
function run(commands, start) {
  let state = start || initialState();
  const events = [];
  for (const command of commands) {
    const result = decide(state, command);
    assert.equal(result.error, undefined, `${command.type} rejected: ${result.error}`);
    for (const event of result.events) {
      state = evolve(state, event);
      events.push(event);
    }
  }
  return { state, events };
}

const P = { projectId: "shop" };
const SHOP = [
  { type: "CreateProject", ...P },
  { type: "AddModel", ...P, model: { name: "LineItem", properties: [{ name: "productId", type: "string" }, { name: "quantity", type: "int32" }] } },
  { type: "AddModel", ...P, model: { name: "Cart", properties: [{ name: "items", type: "LineItem" }] } },
  { type: "AddEntity", ...P, entity: { name: "cart", kind: "EVENT_SOURCED", language: "javascript", source: "entities/shop/cart" } },
  { type: "AddEntity", ...P, entity: { name: "likes", kind: "REPLICATED", language: "javascript", source: "entities/shop/likes" } },
  { type: "AddEntity", ...P, entity: { name: "add-item", kind: "ACTION", language: "javascript", source: "entities/shop/add-item" } },
  { type: "RecordBuild", ...P, entityName: "cart", image: CART_IMAGE },
];

function shop() {
  return run(SHOP).state;
}

function rejection(state, command) {
  const result = decide(state, command);
  assert.equal(result.events, undefined, `${command.type} should be rejected`);
  return result.error;
}

test("a project's commands become events, and replaying them rebuilds the same state", () => {
  const { state, events } = run(SHOP.concat([
    { type: "RecordPromotion", ...P, fromStack: "test", toStack: "prod", references: [{ entityName: "cart", image: CART_IMAGE }] },
  ]));
  assert.deepEqual(events.map((e) => e.type), [
    "ProjectCreated", "ModelAdded", "ModelAdded", "EntityAdded", "EntityAdded", "EntityAdded", "BuildRecorded",
    "PromotionRecorded",
  ]);
  assert.equal(state.projectId, "shop");
  assert.deepEqual(state.models.map((m) => m.name), ["LineItem", "Cart"]);
  assert.deepEqual(state.entities.map((e) => [e.name, e.kind]), [["cart", "EVENT_SOURCED"], ["likes", "REPLICATED"], ["add-item", "ACTION"]]);
  assert.deepEqual(state.builds, [{ entityName: "cart", image: CART_IMAGE }]);
  assert.deepEqual(state.promotions, [{ fromStack: "test", toStack: "prod", references: [{ entityName: "cart", image: CART_IMAGE }] }]);
  assert.deepEqual(replay(events), state);
  // Events survive a round trip through JSON, as they do through the journal.
  assert.deepEqual(replay(JSON.parse(JSON.stringify(events))), state);
});

test("decide and evolve never change the state they are given", () => {
  const state = shop();
  const frozen = JSON.stringify(state);
  const result = decide(state, { type: "RemoveEntity", ...P, name: "likes" });
  evolve(state, result.events[0]);
  assert.equal(JSON.stringify(state), frozen);
});

test("changing and removing models and entities", () => {
  const { state } = run([
    { type: "ChangeModel", ...P, originalName: "Cart", model: { name: "ShoppingCart", properties: [] } },
    { type: "RemoveModel", ...P, name: "ShoppingCart" },
    { type: "RemoveModel", ...P, name: "LineItem" },
    { type: "ChangeEntity", ...P, originalName: "cart", entity: { name: "basket", kind: "EVENT_SOURCED", language: "java", source: "basket" } },
    { type: "RemoveEntity", ...P, name: "likes" },
  ], shop());
  assert.deepEqual(state.models, []);
  assert.deepEqual(state.entities.map((e) => `${e.name}/${e.language}/${e.source}`), ["basket/java/basket", "add-item/javascript/entities/shop/add-item"]);
  // A renamed entity keeps its builds.
  assert.deepEqual(state.builds, [{ entityName: "basket", image: CART_IMAGE }]);
});

test("a model may refer to itself", () => {
  const { state } = run([{ type: "AddModel", ...P, model: { name: "Category", properties: [{ name: "parent", type: "Category" }] } }], shop());
  assert.equal(state.models.length, 3);
});

test("GetProject emits nothing", () => {
  assert.deepEqual(decide(shop(), { type: "GetProject", ...P }), { events: [] });
});

test("rejections name the problem", async (t) => {
  const state = shop();
  const cases = [
    ["a command before CreateProject", initialState(), { type: "AddModel", ...P, model: { name: "A" } }, /project "shop" does not exist; create it first/],
    ["a second CreateProject", state, { type: "CreateProject", ...P }, /project "shop" already exists/],
    ["a project id that is no DNS label", initialState(), { type: "CreateProject", projectId: "Shop_1" }, /projectId "Shop_1" must be a DNS label/],
    ["a missing project id", state, { type: "GetProject" }, /projectId null must be a DNS label/],
    ["an unknown command", state, { type: "Explode", ...P }, /unknown command "Explode"/],
    ["a command without a type", state, { ...P }, /command type is required/],
    ["a duplicate model", state, { type: "AddModel", ...P, model: { name: "Cart", properties: [] } }, /model "Cart" already exists in project "shop"/],
    ["a model name in lower case", state, { type: "AddModel", ...P, model: { name: "cart" } }, /model name "cart" must be UpperCamelCase/],
    ["a missing model", state, { type: "AddModel", ...P }, /model is required/],
    ["a duplicate property", state, { type: "AddModel", ...P, model: { name: "A", properties: [{ name: "x", type: "int32" }, { name: "x", type: "bool" }] } }, /model "A" property "x": duplicate property name/],
    ["a bad property name", state, { type: "AddModel", ...P, model: { name: "A", properties: [{ name: "X-1", type: "int32" }] } }, /property "X-1": name must be lowerCamelCase/],
    ["an unknown property type", state, { type: "AddModel", ...P, model: { name: "A", properties: [{ name: "x", type: "Money" }] } }, /property "x": unknown type "Money" — allowed: int32, .*or a model of the project/],
    ["changing an unknown model", state, { type: "ChangeModel", ...P, originalName: "Nope", model: { name: "Nope" } }, /unknown model "Nope" in project "shop" — known: LineItem, Cart/],
    ["renaming a model onto another", state, { type: "ChangeModel", ...P, originalName: "Cart", model: { name: "LineItem" } }, /model "LineItem" already exists/],
    ["renaming a model in use", state, { type: "ChangeModel", ...P, originalName: "LineItem", model: { name: "Item" } }, /model "LineItem" is used by Cart; change those before renaming it/],
    ["a change that refers to its old name", state, { type: "ChangeModel", ...P, originalName: "Cart", model: { name: "Basket", properties: [{ name: "sub", type: "Cart" }] } }, /unknown type "Cart"/],
    ["removing an unknown model", state, { type: "RemoveModel", ...P, name: "Nope" }, /unknown model "Nope"/],
    ["removing a model in use", state, { type: "RemoveModel", ...P, name: "LineItem" }, /model "LineItem" is used by Cart; change those first/],
    ["a duplicate entity", state, { type: "AddEntity", ...P, entity: { name: "cart", kind: "ACTION", language: "javascript", source: "x" } }, /entity "cart" already exists in project "shop"/],
    ["an entity name that is no DNS label", state, { type: "AddEntity", ...P, entity: { name: "Cart", kind: "ACTION", language: "javascript", source: "x" } }, /entity name "Cart" must be a DNS label/],
    ["an entity name too long", state, { type: "AddEntity", ...P, entity: { name: "a".repeat(41), kind: "ACTION", language: "javascript", source: "x" } }, /at most 40 characters/],
    ["an unset entity kind", state, { type: "AddEntity", ...P, entity: { name: "x", kind: "ENTITY_KIND_UNSPECIFIED", language: "javascript", source: "x" } }, /entity "x": kind "ENTITY_KIND_UNSPECIFIED" is not allowed — allowed: EVENT_SOURCED, REPLICATED, ACTION/],
    ["an unknown language", state, { type: "AddEntity", ...P, entity: { name: "x", kind: "ACTION", language: "cobol", source: "x" } }, /entity "x": language "cobol" is not allowed — allowed: javascript, /],
    ["an absolute source", state, { type: "AddEntity", ...P, entity: { name: "x", kind: "ACTION", language: "go", source: "/etc" } }, /source "\/etc" must be a relative directory/],
    ["a source outside the project", state, { type: "AddEntity", ...P, entity: { name: "x", kind: "ACTION", language: "go", source: "a/../../b" } }, /source "a\/..\/..\/b" must be a relative directory/],
    ["an empty source", state, { type: "AddEntity", ...P, entity: { name: "x", kind: "ACTION", language: "go", source: "" } }, /source "" must be a relative directory/],
    ["a missing entity", state, { type: "AddEntity", ...P }, /entity is required/],
    ["changing an unknown entity", state, { type: "ChangeEntity", ...P, originalName: "nope", entity: { name: "nope", kind: "ACTION", language: "go", source: "x" } }, /unknown entity "nope" in project "shop" — known: cart, likes, add-item/],
    ["renaming an entity onto another", state, { type: "ChangeEntity", ...P, originalName: "cart", entity: { name: "likes", kind: "ACTION", language: "go", source: "x" } }, /entity "likes" already exists/],
    ["removing an unknown entity", state, { type: "RemoveEntity", ...P, name: "nope" }, /unknown entity "nope"/],
    ["a build of an unknown entity", state, { type: "RecordBuild", ...P, entityName: "nope", image: CART_IMAGE }, /unknown entity "nope"/],
    ["a build with a tag only", state, { type: "RecordBuild", ...P, entityName: "cart", image: "localhost:5000/shop/cart:latest" }, /image "localhost:5000\/shop\/cart:latest" of entity "cart" must be pinned by digest/],
    ["a build with a short digest", state, { type: "RecordBuild", ...P, entityName: "cart", image: "localhost:5000/shop/cart@sha256:abc" }, /must be pinned by digest/],
    ["a build without a registry path", state, { type: "RecordBuild", ...P, entityName: "cart", image: "cart@" + DIGEST }, /must be pinned by digest/],
    ["a promotion to the same stack", state, { type: "RecordPromotion", ...P, fromStack: "test", toStack: "test", references: [{ entityName: "cart", image: CART_IMAGE }] }, /fromStack and toStack are both "test"/],
    ["a promotion from no stack", state, { type: "RecordPromotion", ...P, fromStack: "", toStack: "prod", references: [] }, /fromStack "" must be a stack name/],
    ["a promotion to a bad stack name", state, { type: "RecordPromotion", ...P, fromStack: "test", toStack: "pr od", references: [] }, /toStack "pr od" must be a stack name/],
    ["a promotion without references", state, { type: "RecordPromotion", ...P, fromStack: "test", toStack: "prod", references: [] }, /needs at least one reference/],
    ["a promotion of an unknown entity", state, { type: "RecordPromotion", ...P, fromStack: "test", toStack: "prod", references: [{ entityName: "nope", image: CART_IMAGE }] }, /references\[0\]: unknown entity "nope"/],
    ["a promotion by tag", state, { type: "RecordPromotion", ...P, fromStack: "test", toStack: "prod", references: [{ entityName: "cart", image: "localhost:5000/shop/cart:v1" }] }, /references\[0\]: image .* must be pinned by digest/],
    ["a promotion naming an entity twice", state, { type: "RecordPromotion", ...P, fromStack: "test", toStack: "prod", references: [{ entityName: "cart", image: CART_IMAGE }, { entityName: "cart", image: CART_IMAGE }] }, /references\[1\]: entity "cart" listed twice/],
    ["a promotion of an image never built", state, { type: "RecordPromotion", ...P, fromStack: "test", toStack: "prod", references: [{ entityName: "cart", image: "localhost:5000/shop/cart@sha256:" + "cd".repeat(32) }] }, /references\[0\]: image .* was never recorded as a build of entity "cart"/],
  ];
  for (const [name, start, command, expected] of cases) {
    await t.test(name, () => {
      assert.match(rejection(start, command), expected);
    });
  }
});

test("every event type is applied by evolve, and unknown events are refused", () => {
  const samples = {
    ProjectCreated: { projectId: "p" },
    ModelAdded: { model: { name: "A", properties: [] } },
    ModelChanged: { originalName: "A", model: { name: "B", properties: [] } },
    ModelRemoved: { name: "B" },
    EntityAdded: { entity: { name: "e", kind: "ACTION", language: "go", source: "e" } },
    EntityChanged: { originalName: "e", entity: { name: "f", kind: "ACTION", language: "go", source: "f" } },
    BuildRecorded: { build: { entityName: "f", image: CART_IMAGE } },
    PromotionRecorded: { promotion: { fromStack: "a", toStack: "b", references: [] } },
    EntityRemoved: { name: "f" },
  };
  assert.deepEqual(Object.keys(samples).sort(), [...EVENT_TYPES].sort());
  let state = initialState();
  for (const [type, fields] of Object.entries(samples)) {
    const next = evolve(state, { type, ...fields });
    assert.notDeepEqual(next, state, `${type} changed nothing`);
    state = next;
  }
  assert.throws(() => evolve(state, { type: "Exploded" }), /unknown event type "Exploded"/);
});

test("project.proto declares every command and event the logic knows", () => {
  const rpcs = [...PROTO.matchAll(/^\s*rpc (\w+)\((\w+)\)/gm)].map((m) => m[1]);
  const messages = new Set([...PROTO.matchAll(/^message (\w+) \{/gm)].map((m) => m[1]));
  assert.ok(rpcs.length >= 10, "ProjectService has too few rpcs");
  for (const rpc of rpcs) {
    assert.doesNotMatch(decide(shop(), { type: rpc, ...P }).error || "", /unknown command/, rpc);
  }
  for (const event of EVENT_TYPES) assert.ok(messages.has(event), `project.proto lacks message ${event}`);
  // Every command message carries the entity key.
  for (const [, body] of PROTO.matchAll(/^message \w+Command \{([^}]*)\}/gm)) {
    assert.match(body, /string project_id = 1 \[\(\.cloudstate\.entity_key\) = true\];/);
  }
  assert.ok(LANGUAGES.includes("javascript"));
});
