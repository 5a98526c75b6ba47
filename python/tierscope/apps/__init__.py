"""Applications tierscope builds and serves as systems under test."""
