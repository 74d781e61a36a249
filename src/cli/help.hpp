// `deltaflow <command> --help`: each subcommand's usage line, what it does, and every flag it accepts with
// its default. The table is checked against the parsers' flag lists by tests/e2e/test_help.py.
#pragma once

#include <cstdio>
#include <string>

namespace deltaflow::cli {

// Whether argv (after the command name) asks for help: "--help" or "-h" anywhere.
bool wants_help(int argc, char** argv);

// Prints the command's help to `to`; false when there is no such command.
bool print_help(const std::string& command, FILE* to);

}  // namespace deltaflow::cli
