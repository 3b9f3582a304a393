"use strict";
// The add-item action's rules as plain functions, free of the SDK and of gRPC (see src/index.js).
// Runs on the image's Node 12: no syntax newer than ES2019.

// Most units of one product a single request may add.
const MAX_QUANTITY = 99;
const MAX_NAME = 200;
const USER_ID = /^[A-Za-z0-9][A-Za-z0-9_.@-]{0,127}$/;
const PRODUCT_ID = /^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$/;
// The cart's Service in the project namespace: the StatefulService `<project>-cart` serves gRPC
// on port 80 (CloudState's sidecar). CART_ADDRESS overrides it.
const DEFAULT_CART_ADDRESS = "shop-cart:80";
const HOST_PORT = /^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?:[0-9]{1,5}$/;

function quote(value) {
  return JSON.stringify(value === undefined ? null : value);
}

/** The cart's AddItem command for a valid request, or every reason the request is invalid. */
function validate(request) {
  const problems = [];
  if (typeof request.userId !== "string" || !USER_ID.test(request.userId)) {
    problems.push("userId " + quote(request.userId) + " must be 1-128 letters, digits, '_', '.', '@' or '-'");
  }
  if (typeof request.productId !== "string" || !PRODUCT_ID.test(request.productId)) {
    problems.push("productId " + quote(request.productId) + " must be 1-64 letters, digits, '_' or '-'");
  }
  const quantity = request.quantity;
  if (!Number.isInteger(quantity) || quantity < 1 || quantity > MAX_QUANTITY) {
    problems.push("quantity " + quote(quantity) + " must be a whole number from 1 to " + MAX_QUANTITY);
  }
  const name = typeof request.name === "string" ? request.name.trim() : "";
  if (name.length > MAX_NAME) problems.push("name must be at most " + MAX_NAME + " characters");
  if (problems.length) return { error: "invalid add-item request: " + problems.join("; ") };
  return {
    command: { userId: request.userId, productId: request.productId, name: name || request.productId, quantity: quantity },
  };
}

/** host:port of the cart service, from the environment. */
function cartAddress(env) {
  const address = env.CART_ADDRESS || DEFAULT_CART_ADDRESS;
  if (!HOST_PORT.test(address)) {
    throw new Error("CART_ADDRESS " + quote(address) + " must be host:port, e.g. " + DEFAULT_CART_ADDRESS);
  }
  return address;
}

module.exports = { MAX_QUANTITY: MAX_QUANTITY, DEFAULT_CART_ADDRESS: DEFAULT_CART_ADDRESS, validate: validate, cartAddress: cartAddress };
