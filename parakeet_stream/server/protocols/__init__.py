"""One module per wire protocol: each translates its client messages into engine calls and
engine results into its messages; `Session` beneath owns transport, limits and errors."""
