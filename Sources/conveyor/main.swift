import Foundation

exit(await CLI.main(CommandLine.arguments))
