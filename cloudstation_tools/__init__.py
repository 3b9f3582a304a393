"""The command line and its libraries (render, promote, rollback, preflight...): everything that is
not the Pulumi program (infra/) or its components (components/)."""
