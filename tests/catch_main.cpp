// The one translation unit that compiles Catch2's runner; every test file only includes the header.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
