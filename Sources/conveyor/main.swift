import Foundation

if CommandLine.arguments.count > 1, CommandLine.arguments[1] == ChildProcess.supervisorWord {
  ChildProcess.supervise(Array(CommandLine.arguments.dropFirst(2)))
}
exit(await CLI.main(CommandLine.arguments))
