# fish completion for flusherd(8)
set -l cmds run stats sync dirty status check-config print-default-config version help
complete -c flusherd -f
complete -c flusherd -n "not __fish_seen_subcommand_from $cmds" -a run -d 'watch the trees and write their dirty data back'
complete -c flusherd -n "not __fish_seen_subcommand_from $cmds" -a stats -d "print every device's statistics"
complete -c flusherd -n "not __fish_seen_subcommand_from $cmds" -a sync -d 'integrity writeback through the running daemon, and wait'
complete -c flusherd -n "not __fish_seen_subcommand_from $cmds" -a dirty -d 'the tracked files, oldest first'
complete -c flusherd -n "not __fish_seen_subcommand_from $cmds" -a status -d 'a line per tree, then the devices'
complete -c flusherd -n "not __fish_seen_subcommand_from $cmds" -a check-config -d 'validate a configuration file'
complete -c flusherd -n "not __fish_seen_subcommand_from $cmds" -a print-default-config -d 'print the defaults as a configuration file'
complete -c flusherd -n "not __fish_seen_subcommand_from $cmds" -a version -d 'print the version'
complete -c flusherd -n "not __fish_seen_subcommand_from $cmds" -a help -d 'print the help'
complete -c flusherd -n "__fish_seen_subcommand_from run stats sync dirty status check-config" -l config -r -F -d 'the configuration file'
complete -c flusherd -n "__fish_seen_subcommand_from run stats sync dirty status" -l stats-dir -r -a '(__fish_complete_directories)' -d 'directory of the stats files and the control socket'
complete -c flusherd -n "__fish_seen_subcommand_from run" -l watch -r -a '(__fish_complete_directories)' -d 'directory tree to watch (repeatable)'
complete -c flusherd -n "__fish_seen_subcommand_from run" -l log-level -x -a 'debug info warn error' -d 'the lowest level logged'
complete -c flusherd -n "__fish_seen_subcommand_from run" -l log-format -x -a 'console json' -d 'the log line format'
complete -c flusherd -n "__fish_seen_subcommand_from stats" -l files -d 'read the stats files; do not ask the daemon'
complete -c flusherd -n "__fish_seen_subcommand_from sync" -l timeout -x -d 'give up waiting after this duration'
complete -c flusherd -n "__fish_seen_subcommand_from sync check-config dirty" -F
complete -c flusherd -n "__fish_seen_subcommand_from dirty" -l top -x -d 'show the N oldest files (0: all)'
complete -c flusherd -n "__fish_seen_subcommand_from dirty" -l json -d 'print a JSON array'
complete -c flusherd -n "__fish_seen_subcommand_from $cmds" -s h -l help -d 'print the help'
complete -c flusherd -n "__fish_seen_subcommand_from status" -l json -d 'print the status object'
complete -c flusherd -n "__fish_seen_subcommand_from status" -l interval -x -d 'print it again every duration'
