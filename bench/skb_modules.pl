/*  The SKB server's modules, loaded as cod_server.pl loads them (without its
    channels): included by the benches that time the server's own predicates
    (direct_profile.pl, direct_session_profile.pl), so that both load the same.
*/

:- use_module('../skb/prolog/cod_guard').
:- use_module('../skb/prolog/cod_server').
:- use_module('../skb/prolog/cod_apps').
:- use_module('../skb/prolog/cod_direct').
:- use_module('../skb/prolog/cod_pool').
:- use_module('../skb/prolog/cod_limits').
:- use_module('../skb/prolog/cod_grants').
