//! placeholder: detok (being written).
