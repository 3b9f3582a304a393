"use strict";
// Serves the add-item action through the CloudState Node SDK and calls the cart over gRPC.
//
// The SDK's own Stateless class (npm cloudstate 0.0.3) calls handlers synchronously and cannot
// report failures, and CloudState's `forward` only reaches entities of the same user function;
// the cart runs in its own pods. So this file registers the action on the SDK's server itself
// (the StatelessFunction protocol of the SDK's proto files) and answers once the cart has.
const path = require("path");
const grpc = require("grpc");
const protoLoader = require("@grpc/proto-loader");
const CloudState = require("cloudstate").CloudState;
const protobufHelper = require("cloudstate/src/protobuf-helper");
const AnySupport = require("cloudstate/src/protobuf-any");
const addItem = require("./add_item");

const ENTITY_TYPE = "cloudstate.function.StatelessFunction";
const SERVICE = "shop.additem.AddItemAction";
const CART_DEADLINE_MS = 10000;
const includeDirs = protobufHelper.moduleIncludeDirs.concat(["."]);

const root = protobufHelper.loadSync(["add_item.proto"], includeDirs);
const anySupport = new AnySupport(root);
const AddItemRequest = root.lookupType("shop.additem.AddItemRequest");
const Empty = root.lookupType("google.protobuf.Empty");

function loadService(file, includes) {
  return grpc.loadPackageDefinition(protoLoader.loadSync(file, { includeDirs: includes }));
}
const functionProtocol = loadService(path.join("cloudstate", "function.proto"), protobufHelper.moduleIncludeDirs)
  .cloudstate.function.StatelessFunction.service;
const ShoppingCart = loadService("cart_client.proto", includeDirs).shop.cart.ShoppingCart;
const cart = new ShoppingCart(addItem.cartAddress(process.env), grpc.credentials.createInsecure());

function handleUnary(call, callback) {
  function fail(message) {
    callback(null, { failure: { description: message } });
  }
  if (call.request.serviceName !== SERVICE || call.request.name !== "AddItem") {
    return fail("unknown command " + call.request.serviceName + "." + call.request.name);
  }
  const request = AddItemRequest.toObject(anySupport.deserialize(call.request.payload), { defaults: true });
  const result = addItem.validate(request);
  if (result.error) return fail(result.error);
  cart.AddItem(result.command, { deadline: Date.now() + CART_DEADLINE_MS }, function (error) {
    if (error) return fail("the cart did not add the item: " + (error.details || error.message));
    callback(null, { reply: { payload: AnySupport.serialize(Empty.create({}), false, false, true) } });
  });
}

const protocol = {
  entityType: function () {
    return ENTITY_TYPE;
  },
  register: function (server) {
    server.addService(functionProtocol, { handleUnary: handleUnary });
  },
};

// What CloudState's server needs of an entity: its service, type and protocol handlers.
const action = {
  serviceName: SERVICE,
  service: root.lookupService(SERVICE),
  options: { persistenceId: "add-item" },
  entityType: protocol.entityType,
  register: function () {
    return protocol;
  },
};

// The CloudState sidecar connects to PORT (8080 unless the operator says otherwise).
new CloudState()
  .addEntity(action)
  .start({ bindAddress: process.env.HOST || "0.0.0.0", bindPort: Number(process.env.PORT || 8080) });
