// State shared by the CLI's subcommands.
#include "tapeformer/cli/commands.h"

#include <iostream>

#include "tapeformer/blas.h"

TF_NAMESPACE_BEGIN

CLI::Option* add_precision_option(CLI::App& cmd, std::string& precision) {
    return cmd
        .add_option("--precision", precision,
                    "Matrix products in fp32, or bf16 with fp32 sums (weights, softmax, layer norm, loss stay fp32;\n"
                    "without bf16 instructions in the CPU: fp32, with a note)")
        ->check(CLI::IsMember({"fp32", "bf16"}))
        ->capture_default_str();
}

void apply_precision(const std::string& precision) {
    const std::string note = set_precision(parse_precision(precision));
    if (!note.empty()) std::cerr << "tapeformer: note: " << note << "\n";
}

int& command_exit_code() {
    static int code = 0;
    return code;
}

TF_NAMESPACE_END
