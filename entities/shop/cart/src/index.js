"use strict";
// Wires src/cart.js into the CloudState Node SDK. Only this file needs the SDK.
const EventSourced = require("cloudstate").EventSourced;
const cart = require("./cart");

const PACKAGE = "shop.cart.";
const entity = new EventSourced(["cart.proto"], PACKAGE + "ShoppingCart", { persistenceId: "shopping-cart" });
const Cart = entity.lookupType(PACKAGE + "Cart");

// Protobuf messages <-> the plain objects cart.js works on.
function plain(type, message) {
  return type.toObject(message, { defaults: true, arrays: true });
}

entity.setInitial(function () {
  return Cart.create({});
});

entity.setBehavior(function () {
  const commandHandlers = {};
  entity.service.methodsArray.forEach(function (method) {
    commandHandlers[method.name] = function (command, state, ctx) {
      const request = Object.assign({ type: method.name }, plain(method.resolvedRequestType, command));
      const result = cart.decide(plain(Cart, state), request);
      if (result.error) ctx.fail(result.error);
      result.events.forEach(function (event) {
        const fields = Object.assign({}, event);
        delete fields.type;
        ctx.emit(entity.lookupType(PACKAGE + event.type).fromObject(fields));
      });
      return method.name === "GetCart" ? state : {};
    };
  });
  const eventHandlers = {};
  cart.EVENT_TYPES.forEach(function (name) {
    const eventType = entity.lookupType(PACKAGE + name);
    eventHandlers[name] = function (event, state) {
      return Cart.fromObject(cart.evolve(plain(Cart, state), Object.assign({ type: name }, plain(eventType, event))));
    };
  });
  return { commandHandlers: commandHandlers, eventHandlers: eventHandlers };
});

// The CloudState sidecar connects to PORT (8080 unless the operator says otherwise).
entity.start({ bindAddress: process.env.HOST || "0.0.0.0", bindPort: Number(process.env.PORT || 8080) });
