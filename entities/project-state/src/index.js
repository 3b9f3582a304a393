"use strict";
// Wires src/project.js into the CloudState Node SDK: every RPC of ProjectService becomes a
// command for decide(), every event goes through evolve(). Only this file needs the SDK.
const EventSourced = require("cloudstate").EventSourced;
const project = require("./project");

const PACKAGE = "cloudstation.project.";
const entity = new EventSourced(["project.proto"], PACKAGE + "ProjectService", {
  persistenceId: "project",
  snapshotEvery: 50,
});

const Project = entity.lookupType(PACKAGE + "Project");
const COMMANDS = entity.service.methodsArray.map(function (method) {
  return method.name;
});

// Protobuf messages <-> the plain objects project.js works on (enums by name, empty lists kept).
function plain(type, message) {
  return type.toObject(message, { enums: String, defaults: true, arrays: true });
}

entity.setInitial(function () {
  return Project.create({});
});

entity.setBehavior(function () {
  const commandHandlers = {};
  COMMANDS.forEach(function (name) {
    const commandType = entity.service.methods[name].resolvedRequestType;
    commandHandlers[name] = function (command, state, ctx) {
      const current = plain(Project, state);
      const result = project.decide(current, Object.assign({ type: name }, plain(commandType, command)));
      if (result.error) ctx.fail(result.error);
      result.events.forEach(function (event) {
        const fields = Object.assign({}, event);
        delete fields.type;
        ctx.emit(entity.lookupType(PACKAGE + event.type).fromObject(fields));
      });
      return name === "GetProject" ? state : {};
    };
  });

  const eventHandlers = {};
  project.EVENT_TYPES.forEach(function (name) {
    const eventType = entity.lookupType(PACKAGE + name);
    eventHandlers[name] = function (event, state) {
      const next = project.evolve(plain(Project, state), Object.assign({ type: name }, plain(eventType, event)));
      return Project.fromObject(next);
    };
  });
  return { commandHandlers: commandHandlers, eventHandlers: eventHandlers };
});

// The CloudState sidecar connects to PORT (8080 unless the operator says otherwise).
entity.start({ bindAddress: process.env.HOST || "0.0.0.0", bindPort: Number(process.env.PORT || 8080) });
