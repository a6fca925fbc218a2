// State shared by the CLI's subcommands.
#include "tapeformer/cli/commands.h"

TF_NAMESPACE_BEGIN

int& command_exit_code() {
    static int code = 0;
    return code;
}

TF_NAMESPACE_END
