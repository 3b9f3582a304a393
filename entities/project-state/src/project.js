"use strict";
// The Project entity's behaviour as plain functions, free of the CloudState SDK so that the tests
// run with Node alone. Runs on the image's Node 12: no syntax newer than ES2019 (no `?.`, no `??`).
//
//   decide(state, command) -> { events: [event, ...] } | { error: "why the command is rejected" }
//   evolve(state, event)   -> the next state
//   replay(events)         -> the state rebuilt from an event log
//
// Commands and events are plain objects `{ type, ...fields }` whose fields are the camelCase
// fields of the messages in project.proto; `type` is the RPC name (commands) or the event
// message name (events). The state has the shape of the `Project` message.

const ENTITY_KINDS = ["EVENT_SOURCED", "REPLICATED", "ACTION"];

// Same values as infra/config.py `Language` (tests/test_entities.py checks that).
const LANGUAGES = ["javascript", "java", "go", "python", "dart", "scala", "kotlin", "csharp", "rust"];

// Scalar property types; any other property type must name a model of the project.
// The events, each the name of a message in project.proto.
const EVENT_TYPES = [
  "ProjectCreated", "ModelAdded", "ModelChanged", "ModelRemoved", "EntityAdded", "EntityChanged",
  "EntityRemoved", "BuildRecorded", "PromotionRecorded",
];

const STATIC_TYPES = ["int32", "int64", "float", "double", "string", "bool", "bytes"];

// Same rule as the stack config's project and entity names (components/model.py ShortDnsLabel):
// they become namespace, Service and image names.
const DNS_LABEL = /^[a-z]([-a-z0-9]*[a-z0-9])?$/;
const MAX_NAME = 40;
const MODEL_NAME = /^[A-Z][A-Za-z0-9]{0,63}$/;
const PROPERTY_NAME = /^[a-z][A-Za-z0-9]{0,63}$/;
const STACK_NAME = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$/;

// Same rule as infra/config.py DIGEST_REF: host[:port]/path[:tag]@sha256:<64 hex>.
const DIGEST_REF = new RegExp(
  "^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)+" +
    "(:[\\w][\\w.-]{0,127})?@sha256:[0-9a-f]{64}$"
);
const DIGEST_RULE = "must be pinned by digest: <registry>/<repository>[:tag]@sha256:<64 hex digits>";

function initialState() {
  return { projectId: "", models: [], entities: [], builds: [], promotions: [] };
}

function quote(value) {
  return JSON.stringify(value === undefined ? null : value);
}

function reject(message) {
  return { error: message };
}

function accept(event) {
  return { events: [event] };
}

function findByName(items, name) {
  return items.find(function (item) {
    return item.name === name;
  });
}

function checkProjectId(id) {
  if (typeof id !== "string" || !DNS_LABEL.test(id) || id.length > MAX_NAME) {
    return (
      "projectId " + quote(id) + " must be a DNS label: lowercase letters, digits and '-', starting with a " +
      "letter, ending with a letter or digit, at most " + MAX_NAME + " characters"
    );
  }
  return null;
}

function checkModel(state, model, replacing) {
  if (!model || typeof model !== "object") return "model is required";
  if (typeof model.name !== "string" || !MODEL_NAME.test(model.name)) {
    return "model name " + quote(model.name) + " must be UpperCamelCase letters and digits, at most 64 characters";
  }
  const properties = model.properties || [];
  const seen = {};
  for (let i = 0; i < properties.length; i++) {
    const property = properties[i];
    const where = "model " + quote(model.name) + " property " + quote(property.name);
    if (typeof property.name !== "string" || !PROPERTY_NAME.test(property.name)) {
      return where + ": name must be lowerCamelCase letters and digits, at most 64 characters";
    }
    if (seen[property.name]) return where + ": duplicate property name";
    seen[property.name] = true;
    const type = property.type;
    const known =
      STATIC_TYPES.indexOf(type) >= 0 ||
      type === model.name ||
      state.models.some(function (m) {
        return m.name === type && m.name !== replacing;
      });
    if (!known) {
      return (
        where + ": unknown type " + quote(type) + " — allowed: " + STATIC_TYPES.join(", ") +
        ", or a model of the project"
      );
    }
  }
  return null;
}

// Models whose properties use `name` as their type, other than the model itself.
function modelsUsing(state, name) {
  return state.models
    .filter(function (m) {
      return (
        m.name !== name &&
        (m.properties || []).some(function (p) {
          return p.type === name;
        })
      );
    })
    .map(function (m) {
      return m.name;
    });
}

function checkEntity(entity) {
  if (!entity || typeof entity !== "object") return "entity is required";
  if (typeof entity.name !== "string" || !DNS_LABEL.test(entity.name) || entity.name.length > MAX_NAME) {
    return (
      "entity name " + quote(entity.name) + " must be a DNS label: lowercase letters, digits and '-', starting " +
      "with a letter, ending with a letter or digit, at most " + MAX_NAME + " characters"
    );
  }
  const where = "entity " + quote(entity.name);
  if (ENTITY_KINDS.indexOf(entity.kind) < 0) {
    return where + ": kind " + quote(entity.kind) + " is not allowed — allowed: " + ENTITY_KINDS.join(", ");
  }
  if (LANGUAGES.indexOf(entity.language) < 0) {
    return where + ": language " + quote(entity.language) + " is not allowed — allowed: " + LANGUAGES.join(", ");
  }
  const source = entity.source;
  const segments = typeof source === "string" ? source.split("/") : [];
  if (
    typeof source !== "string" ||
    source === "" ||
    source.charAt(0) === "/" ||
    source.indexOf("\\") >= 0 ||
    segments.some(function (s) {
      return s === ".." || s === "";
    })
  ) {
    return (
      where + ": source " + quote(source) + " must be a relative directory inside the project " +
      "(no leading '/', no '..', no empty segments)"
    );
  }
  return null;
}

function checkImage(image, entityName) {
  if (typeof image !== "string" || !DIGEST_REF.test(image)) {
    return "image " + quote(image) + " of entity " + quote(entityName) + " " + DIGEST_RULE;
  }
  return null;
}

function knownEntity(state, name) {
  if (!findByName(state.entities, name)) {
    const names = state.entities.map(function (e) {
      return e.name;
    });
    return (
      "unknown entity " + quote(name) + " in project " + quote(state.projectId) + " — known: " +
      (names.length ? names.join(", ") : "none")
    );
  }
  return null;
}

function knownModel(state, name) {
  if (!findByName(state.models, name)) {
    const names = state.models.map(function (m) {
      return m.name;
    });
    return (
      "unknown model " + quote(name) + " in project " + quote(state.projectId) + " — known: " +
      (names.length ? names.join(", ") : "none")
    );
  }
  return null;
}

function checkPromotion(state, command) {
  const from = command.fromStack;
  const to = command.toStack;
  if (typeof from !== "string" || !STACK_NAME.test(from)) {
    return "fromStack " + quote(from) + " must be a stack name (letters, digits, '-', '_', '.')";
  }
  if (typeof to !== "string" || !STACK_NAME.test(to)) {
    return "toStack " + quote(to) + " must be a stack name (letters, digits, '-', '_', '.')";
  }
  if (from === to) return "fromStack and toStack are both " + quote(from) + "; a promotion goes to another stack";
  const references = command.references || [];
  if (references.length === 0) return "a promotion needs at least one reference (entityName, image)";
  const seen = {};
  for (let i = 0; i < references.length; i++) {
    const reference = references[i];
    const problem = knownEntity(state, reference.entityName) || checkImage(reference.image, reference.entityName);
    if (problem) return "references[" + i + "]: " + problem;
    if (seen[reference.entityName]) return "references[" + i + "]: entity " + quote(reference.entityName) + " listed twice";
    seen[reference.entityName] = true;
    const built = state.builds.some(function (b) {
      return b.entityName === reference.entityName && b.image === reference.image;
    });
    if (!built) {
      return (
        "references[" + i + "]: image " + quote(reference.image) + " was never recorded as a build of entity " +
        quote(reference.entityName) + "; only built images can be promoted"
      );
    }
  }
  return null;
}

function copyModel(model) {
  return {
    name: model.name,
    properties: (model.properties || []).map(function (p) {
      return { name: p.name, type: p.type };
    }),
  };
}

function copyEntity(entity) {
  return { name: entity.name, kind: entity.kind, language: entity.language, source: entity.source };
}

/** The events a command produces in `state`, or why it is rejected. Never changes `state`. */
function decide(state, command) {
  if (!command || typeof command.type !== "string") return reject("command type is required");
  const idProblem = checkProjectId(command.projectId);
  if (idProblem) return reject(idProblem);
  if (command.type === "CreateProject") {
    if (state.projectId) return reject("project " + quote(state.projectId) + " already exists");
    return accept({ type: "ProjectCreated", projectId: command.projectId });
  }
  if (!state.projectId) {
    return reject("project " + quote(command.projectId) + " does not exist; create it first (CreateProject)");
  }
  let problem;
  switch (command.type) {
    case "AddModel":
      problem = checkModel(state, command.model, null);
      if (problem) return reject(problem);
      if (findByName(state.models, command.model.name)) {
        return reject("model " + quote(command.model.name) + " already exists in project " + quote(state.projectId));
      }
      return accept({ type: "ModelAdded", model: copyModel(command.model) });

    case "ChangeModel": {
      problem = knownModel(state, command.originalName) || checkModel(state, command.model, command.originalName);
      if (problem) return reject(problem);
      const renamed = command.model.name !== command.originalName;
      if (renamed && findByName(state.models, command.model.name)) {
        return reject("model " + quote(command.model.name) + " already exists in project " + quote(state.projectId));
      }
      const users = modelsUsing(state, command.originalName);
      if (renamed && users.length) {
        return reject(
          "model " + quote(command.originalName) + " is used by " + users.join(", ") + "; change those before renaming it"
        );
      }
      return accept({ type: "ModelChanged", originalName: command.originalName, model: copyModel(command.model) });
    }

    case "RemoveModel": {
      problem = knownModel(state, command.name);
      if (problem) return reject(problem);
      const users = modelsUsing(state, command.name);
      if (users.length) {
        return reject("model " + quote(command.name) + " is used by " + users.join(", ") + "; change those first");
      }
      return accept({ type: "ModelRemoved", name: command.name });
    }

    case "AddEntity":
      problem = checkEntity(command.entity);
      if (problem) return reject(problem);
      if (findByName(state.entities, command.entity.name)) {
        return reject("entity " + quote(command.entity.name) + " already exists in project " + quote(state.projectId));
      }
      return accept({ type: "EntityAdded", entity: copyEntity(command.entity) });

    case "ChangeEntity":
      problem = knownEntity(state, command.originalName) || checkEntity(command.entity);
      if (problem) return reject(problem);
      if (command.entity.name !== command.originalName && findByName(state.entities, command.entity.name)) {
        return reject("entity " + quote(command.entity.name) + " already exists in project " + quote(state.projectId));
      }
      return accept({ type: "EntityChanged", originalName: command.originalName, entity: copyEntity(command.entity) });

    case "RemoveEntity":
      problem = knownEntity(state, command.name);
      if (problem) return reject(problem);
      return accept({ type: "EntityRemoved", name: command.name });

    case "RecordBuild":
      problem = knownEntity(state, command.entityName) || checkImage(command.image, command.entityName);
      if (problem) return reject(problem);
      return accept({ type: "BuildRecorded", build: { entityName: command.entityName, image: command.image } });

    case "RecordPromotion":
      problem = checkPromotion(state, command);
      if (problem) return reject(problem);
      return accept({
        type: "PromotionRecorded",
        promotion: {
          fromStack: command.fromStack,
          toStack: command.toStack,
          references: command.references.map(function (r) {
            return { entityName: r.entityName, image: r.image };
          }),
        },
      });

    case "GetProject":
      return { events: [] };

    default:
      return reject("unknown command " + quote(command.type));
  }
}

function replaceNamed(items, originalName, replacement) {
  return items.map(function (item) {
    return item.name === originalName ? replacement : item;
  });
}

function withoutNamed(items, name) {
  return items.filter(function (item) {
    return item.name !== name;
  });
}

/** The state after `event`; `state` itself is left unchanged. Events were validated by decide. */
function evolve(state, event) {
  const next = Object.assign({}, state);
  switch (event.type) {
    case "ProjectCreated":
      next.projectId = event.projectId;
      break;
    case "ModelAdded":
      next.models = state.models.concat([copyModel(event.model)]);
      break;
    case "ModelChanged":
      next.models = replaceNamed(state.models, event.originalName, copyModel(event.model));
      break;
    case "ModelRemoved":
      next.models = withoutNamed(state.models, event.name);
      break;
    case "EntityAdded":
      next.entities = state.entities.concat([copyEntity(event.entity)]);
      break;
    case "EntityChanged":
      next.entities = replaceNamed(state.entities, event.originalName, copyEntity(event.entity));
      // A renamed entity keeps its build history.
      next.builds = state.builds.map(function (b) {
        return b.entityName === event.originalName ? { entityName: event.entity.name, image: b.image } : b;
      });
      break;
    case "EntityRemoved":
      next.entities = withoutNamed(state.entities, event.name);
      break;
    case "BuildRecorded":
      next.builds = state.builds.concat([{ entityName: event.build.entityName, image: event.build.image }]);
      break;
    case "PromotionRecorded":
      next.promotions = state.promotions.concat([event.promotion]);
      break;
    default:
      throw new Error("unknown event type " + quote(event.type));
  }
  return next;
}

function replay(events) {
  return events.reduce(evolve, initialState());
}

module.exports = {
  DIGEST_REF: DIGEST_REF,
  ENTITY_KINDS: ENTITY_KINDS,
  EVENT_TYPES: EVENT_TYPES,
  LANGUAGES: LANGUAGES,
  STATIC_TYPES: STATIC_TYPES,
  initialState: initialState,
  decide: decide,
  evolve: evolve,
  replay: replay,
};
