# bash completion for flusherd(8)
_flusherd() {
	local cur prev cmd i
	cur=${COMP_WORDS[COMP_CWORD]}
	prev=${COMP_WORDS[COMP_CWORD-1]}
	cmd=
	for ((i = 1; i < COMP_CWORD; i++)); do
		case ${COMP_WORDS[i]} in
		-*) ;;
		*) cmd=${COMP_WORDS[i]}; break ;;
		esac
	done
	if [[ -z $cmd ]]; then
		COMPREPLY=($(compgen -W 'run stats sync dirty status check-config print-default-config version help --help --version' -- "$cur"))
		return
	fi
	case $prev in
	--config)
		COMPREPLY=($(compgen -f -- "$cur"))
		return
		;;
	--stats-dir | --watch)
		COMPREPLY=($(compgen -d -- "$cur"))
		return
		;;
	--timeout | --top | --interval)
		return
		;;
	--log-level)
		COMPREPLY=($(compgen -W 'debug info warn error' -- "$cur"))
		return
		;;
	--log-format)
		COMPREPLY=($(compgen -W 'console json' -- "$cur"))
		return
		;;
	esac
	local flags
	case $cmd in
	run) flags='--config --stats-dir --watch --log-level --log-format' ;;
	stats) flags='--config --stats-dir --files' ;;
	sync) flags='--config --stats-dir --timeout' ;;
	dirty) flags='--config --stats-dir --top --json' ;;
	status) flags='--config --stats-dir --json --interval' ;;
	check-config) flags='--config' ;;
	print-default-config | version | help) flags= ;;
	*) return ;;
	esac
	if [[ $cur == -* ]]; then
		COMPREPLY=($(compgen -W "$flags --help" -- "$cur"))
		return
	fi
	case $cmd in
	sync | check-config | dirty) COMPREPLY=($(compgen -f -- "$cur")) ;;
	esac
}
complete -F _flusherd flusherd
