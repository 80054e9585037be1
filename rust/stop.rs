//! placeholder: stop (being written).
