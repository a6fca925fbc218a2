// The CLI's subcommands. Each add_*_command registers its flags on `app` and a callback that fills a
// config struct and calls into the library; apps/tapeformer.cpp only calls these and reports errors.
#pragma once
#include <CLI/CLI.hpp>

#include "tapeformer/config.h"

TF_NAMESPACE_BEGIN

void add_gradcheck_command(CLI::App& app);

// Exit status a command's callback wants main to return (0 = success). Set by callbacks.
int& command_exit_code();

TF_NAMESPACE_END
