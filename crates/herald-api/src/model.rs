//! Wire types of the Svix-compatible API.
