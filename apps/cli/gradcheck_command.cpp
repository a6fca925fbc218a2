// `tapeformer gradcheck`: every primitive op and model block against central differences, in float64.
#include <unistd.h>

#include "cli/commands.h"
#include "tapeformer/gradcheck_cli.h"
#include "tapeformer/ops.h"
#include "tapeformer/reference_ops.h"

TF_NAMESPACE_BEGIN

void add_gradcheck_command(CLI::App& app) {
    auto opt = std::make_shared<tf::f64::GradcheckCliOptions>();
    CLI::App* cmd = app.add_subcommand(
        "gradcheck",
        "Check every op's backward against central finite differences (float64) and print a table.\n"
        "Exits with status 1 when any check fails (with --break-grad: when none does).\n"
        "Example: tapeformer gradcheck --op softmax");
    cmd->add_option("--seed", opt->seed, "Seed of the random inputs")->capture_default_str();
    auto* filter = cmd->add_option("--filter", opt->filter, "Only checks whose name contains this text (e.g. matmul)");
    auto* list = cmd->add_flag("--list", opt->list_only, "List the checks' names and exit");
    cmd->add_option("--op", opt->op,
                    "Check one op (add, matmul, softmax, layer_norm, ...; an unknown name lists them all) and print,\n"
                    "element by element, the analytic gradient, the numeric one and the relative error")
        ->excludes(filter)
        ->excludes(list);
    cmd->add_option("--break-grad", opt->break_grad,
                    "Run the checks with a deliberately wrong backward, to see what a failing check looks like:\n"
                    "layernorm-mean (LayerNorm's backward without its mean term) or layernorm-variance (without its\n"
                    "variance term); then the exit status is 0 when a check caught it, 1 when none did.\n"
                    "Example: tapeformer gradcheck --op layer_norm --break-grad layernorm-mean")
        ->check(CLI::IsMember(broken_gradient_names()));
    cmd->callback([opt]() {
        opt->color = isatty(STDOUT_FILENO) != 0;
        opt->reference = reference_mode();  // the global --reference switches the float32 ops; this, the float64 ones
        command_exit_code() = tf::f64::run_gradcheck_cli(*opt) > 0 ? 1 : 0;
    });
}

TF_NAMESPACE_END
