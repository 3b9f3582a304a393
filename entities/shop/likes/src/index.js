"use strict";
// Wires src/likes.js into the CloudState Node SDK. Only this file needs the SDK.
const crdt = require("cloudstate").crdt;
const likes = require("./likes");

const entity = new crdt.Crdt(["likes.proto"], "shop.likes.Likes", { persistenceId: "likes" });
entity.defaultValue = function () {
  return new crdt.PNCounter();
};

entity.service.methodsArray.forEach(function (method) {
  entity.commandHandlers[method.name] = function (command, ctx) {
    const counter = ctx.state;
    const result = likes.decide(counter.value, { type: method.name, itemId: command.itemId });
    if (result.error) ctx.fail(result.error);
    if (result.delta !== 0) counter.increment(result.delta);
    return { itemId: command.itemId, likes: likes.shown(counter.value) };
  };
});

// The CloudState sidecar connects to PORT (8080 unless the operator says otherwise).
entity.start({ bindAddress: process.env.HOST || "0.0.0.0", bindPort: Number(process.env.PORT || 8080) });
