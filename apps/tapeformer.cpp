// tapeformer: the command-line tool. Each subcommand lives in cli/; this file wires them together
// and turns any error into one line on stderr and a non-zero exit code.
#include <CLI/CLI.hpp>
#include <csignal>
#include <exception>
#include <iostream>

#include "tapeformer/blas.h"
#include "cli/commands.h"
#include "tapeformer/error.h"
#include "tapeformer/reference_ops.h"
#include "tapeformer/run/distributed.h"

int main(int argc, char** argv) {
    tf::configure_runtime(argv);  // may restart the program once with OMP_WAIT_POLICY / OPENBLAS_CORETYPE set
    // A closed pipe on stdout: the write fails with EPIPE and the error is reported (one line, exit 1)
    // instead of the process ending silently by signal.
    std::signal(SIGPIPE, SIG_IGN);
    tf::watch_standard_output();
    CLI::App app{"tapeformer: train, inspect and run small Transformers (encoder-decoder, or decoder-only) on the CPU"};
    app.require_subcommand(1);
    app.fallthrough();
    int threads = 0;
    app.add_option("--threads", threads, "Threads for OpenMP and OpenBLAS together (default: all cores)")
        ->check(CLI::Range(1, 1024));
    bool reference = false;
    app.add_flag("--reference", reference,
                 "Reference mode: every op in its textbook form (src/reference_ops.cpp: products as three loops, no\n"
                 "BLAS, no fused kernels, std::exp, one thread), to read and to check the fast ops against; slower");
    app.parse_complete_callback([&]() {
        tf::apply_threads(threads, "--threads");
        tf::set_reference_mode(reference);  // after the threads: reference mode runs on one
    });

    tf::add_train_command(app);
    tf::add_gradcheck_command(app);
    tf::add_bench_command(app);
    tf::add_translate_command(app);
    tf::add_generate_command(app);
    tf::add_eval_command(app);
    tf::add_encode_command(app);
    tf::add_data_command(app);
    tf::add_summary_command(app);
    tf::add_heads_command(app);
    tf::add_attention_command(app);
    tf::add_explain_command(app);
    tf::add_tape_command(app);
    tf::add_report_command(app);
    tf::add_average_command(app);
    tf::add_exercise_command(app);
    tf::check_integer_flags(app);

    try {
        tf::check_subcommand_name(app, argc, argv);
        app.parse(argc, argv);
        tf::finish_standard_output();  // a command's printed results that did not reach stdout are an error
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        std::cerr << "tapeformer: " << tf::one_line(e.what()) << " (see tapeformer --help)\n";
        return e.get_exit_code() ? e.get_exit_code() : 2;
    } catch (const tf::AnotherRankFailed&) {
        return 1;  // an MPI job's rank whose peer could not start the run: that rank says why
    } catch (const std::exception& e) {
        std::cerr << "tapeformer: error: " << tf::one_line(e.what()) << "\n";
        tf::end_job_after_error(1);  // an MPI job's other ranks may be waiting for this one: end them too
        return 1;
    }
    return tf::command_exit_code();
}
