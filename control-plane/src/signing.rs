//! Placeholder: written by the control-plane work in progress.
