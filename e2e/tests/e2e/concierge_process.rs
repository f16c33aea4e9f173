//! Placeholder: end-to-end tests of work in progress.
