"use strict";
// The cart's behaviour as plain functions, free of the CloudState SDK (see src/index.js).
// Runs on the image's Node 12: no syntax newer than ES2019.
//
//   decide(cart, command) -> { events: [...] } | { error }     evolve(cart, event) -> cart
//
// Commands are `{ type: <rpc name>, ...fields }`, events `{ type: <message name>, ...fields }`,
// the cart has the shape of the `Cart` message (camelCase fields, as in cart.proto).

const EVENT_TYPES = ["ItemAdded", "ItemRemoved"];
// Most units of one product a cart holds.
const MAX_LINE_QUANTITY = 1000;

function initialState() {
  return { items: [] };
}

function quote(value) {
  return JSON.stringify(value === undefined ? null : value);
}

function lineOf(cart, productId) {
  return cart.items.find(function (item) {
    return item.productId === productId;
  });
}

function decide(cart, command) {
  switch (command.type) {
    case "AddItem": {
      if (typeof command.productId !== "string" || command.productId === "") {
        return { error: "productId is required" };
      }
      const quantity = command.quantity;
      if (!Number.isInteger(quantity) || quantity < 1) {
        return { error: "quantity " + quote(quantity) + " of " + quote(command.productId) + " must be a whole number of at least 1" };
      }
      const line = lineOf(cart, command.productId);
      const total = (line ? line.quantity : 0) + quantity;
      if (total > MAX_LINE_QUANTITY) {
        return {
          error: "the cart would hold " + total + " of " + quote(command.productId) + "; at most " + MAX_LINE_QUANTITY + " allowed",
        };
      }
      const name = command.name || (line ? line.name : command.productId);
      return { events: [{ type: "ItemAdded", item: { productId: command.productId, name: name, quantity: quantity } }] };
    }
    case "RemoveItem":
      if (!lineOf(cart, command.productId)) {
        return { error: "product " + quote(command.productId) + " is not in the cart" };
      }
      return { events: [{ type: "ItemRemoved", productId: command.productId }] };
    case "GetCart":
      return { events: [] };
    default:
      return { error: "unknown command " + quote(command.type) };
  }
}

function evolve(cart, event) {
  switch (event.type) {
    case "ItemAdded": {
      const added = event.item;
      if (!lineOf(cart, added.productId)) {
        return { items: cart.items.concat([{ productId: added.productId, name: added.name, quantity: added.quantity }]) };
      }
      return {
        items: cart.items.map(function (item) {
          return item.productId === added.productId
            ? { productId: item.productId, name: added.name, quantity: item.quantity + added.quantity }
            : item;
        }),
      };
    }
    case "ItemRemoved":
      return {
        items: cart.items.filter(function (item) {
          return item.productId !== event.productId;
        }),
      };
    default:
      throw new Error("unknown event type " + quote(event.type));
  }
}

function replay(events) {
  return events.reduce(evolve, initialState());
}

module.exports = {
  EVENT_TYPES: EVENT_TYPES,
  MAX_LINE_QUANTITY: MAX_LINE_QUANTITY,
  initialState: initialState,
  decide: decide,
  evolve: evolve,
  replay: replay,
};
