//! Real llama.cpp server tests: see main.rs.
